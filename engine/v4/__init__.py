"""The DeepSeek-V4 family: hyper-connections, compressed sparse attention, hash-routed MoE, MXFP4 experts."""
