"""sacplan HTTP service: FastAPI over SQLAlchemy, caching plans per stats upload.

``service.main.create_app`` builds the app. Imports the planner; never torch.

Rooms, each importing only those below it (a request flows down through them)::

    main, cli      the app and the CLI, where the rooms meet
    api/           routes, deps, auth, the fast path, error handlers    } siblings: neither
    docs/          the OpenAPI document, /docs and /redoc, examples     } imports the other
    views/         response bodies of stored rows, charts, render processes
    solving/       cached, or solved once; the solver processes
    store/         the database: engine, models, ids, stats/plan/sweep rows
    transport/     request deadlines, body limits, upload limits
    config, errors, schemas, examples, metrics, text, times, version, lazy: shared leaves

A room imports from another only the names its ``__init__`` lists in ``__all__``.
"""
