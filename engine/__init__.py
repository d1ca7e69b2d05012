"""The bundled reference engine: DeepSeek-V3-family model, weight loading, KV cache, greedy decode, goldens."""
