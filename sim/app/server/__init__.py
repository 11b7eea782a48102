"""``kvsim serve --http``: the simulated card behind an OpenAI-compatible endpoint (the
optional extra ``kvsim[server]``: FastAPI, uvicorn, prometheus_client)."""
