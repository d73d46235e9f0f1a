"""`xattn serve`: an HTTP translation API (LibreTranslate-compatible) with cross-request batching, and a page
that shows the cross-attention live. app.py (FastAPI routes), models.py (the models served, one per language pair,
and the routing of a request to one), api.py (requests, limits, responses), batcher.py (cross-request batching),
engine.py (the one translation thread per model, in fair turns), metrics.py (access log, /metrics), static/ (the page)."""
