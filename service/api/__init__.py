"""The HTTP API: dependencies and one router per resource."""
