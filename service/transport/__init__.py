"""Transport and limits: how requests arrive and how big they may be, before any room looks at them.

``server`` (uvicorn's options: request deadlines, ``framing``'s refusal of
ambiguous framing, TCP_NODELAY, proxy trust,
secret-free logs), ``middleware`` (the body size limit), ``large_body``
(JSON bodies over a MiB handed to a route unparsed) and ``limits`` (the
limits that are settings, checked on requests and written into the OpenAPI
document). Imports only the top-level modules.
"""

from service.lazy import exports

__all__ = [
    # limits
    "UploadLimits", "check_upload", "check_time_limit", "document_limits", "MIN_TIME_LIMIT_S",
    # middleware
    "BodySizeLimit", "replay_body", "arrived_at",
    # large_body
    "DeferredBodyRoute", "deferred_body_route", "deferred_body", "LARGE_BODY_BYTES",
    # framing
    "StrictFramingConnection", "ambiguous_framing",
    # server
    "DeadlineH11Protocol", "RedactSecrets", "uvicorn_options", "install_log_redaction",
]

__getattr__ = exports(__name__, ("limits", "middleware", "large_body", "framing", "server"), __all__)
