"""The bandgate HTTP gateway (Starlette + uvicorn): routes, schemas, auth, limits."""
