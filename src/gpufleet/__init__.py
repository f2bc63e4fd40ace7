"""gpufleet: bare GPU hosts to fast, safe LLM endpoints (CLI over the gpufleet.serving collection)."""

__version__ = "0.1.0"
