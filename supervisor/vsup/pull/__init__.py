"""`vsup pull`: a hub model's files on the node before its servers start (docs/pull.md).

The downloads are huggingface_hub's (`hf_hub_download` per file: its file locks, its cache
layout, its retries with HTTP Range after a cut connection); vsup decides which files (the ones
vLLM loads: `selection`), checks the disk before the first byte (`cache`), shows the progress
(`progress`), and tells a pulled model's instances where its snapshot is (`targets`). The daemon
runs a pull in a child process (`worker`) so that a dropped SSH session does not stop a 100 GB
download; `vsup pull` runs one in the terminal.

Modules: `errors` (PullError and its reasons), `selection` (which files), `cache` (where the
Hugging Face cache is, what it holds, free space), `remote` (the hub's file list, errors as
reasons), `progress` (bytes, rates, ETAs; the bar class huggingface_hub drives), `run`
(`pull_model`), `targets` (layout specs -> pulls; pulled specs), `worker` (the daemon's child).
Never imports engine, control, tui, Textual or Rich.
"""
