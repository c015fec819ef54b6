"""HTTP routes and request/response schemas."""
