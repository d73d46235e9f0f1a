"""`xattn serve`: an HTTP translation API (LibreTranslate-compatible) with cross-request batching, and a page
that shows the cross-attention live. app.py (FastAPI routes), api.py (requests, limits, responses),
batcher.py (cross-request batching on one translation thread), static/ (the page)."""
