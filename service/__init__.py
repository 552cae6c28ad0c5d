"""sacplan HTTP service: FastAPI over SQLAlchemy, caching plans per stats upload.

``service.main.create_app`` builds the app. Imports the planner; never torch.
"""
