"""What runs leave on disk and how it is read back.

- `files`: JSON, CSV, metrics.jsonl and TensorBoard events, checkpoint paths;
- `jobs`: a sweep job's record (job.json) and keeping earlier attempts;
- `plots`: every figure the runner draws (matplotlib, file-only).
"""
