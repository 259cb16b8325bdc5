"""GGUF files -> cached Hugging Face folders.

  header   a file's header (metadata and tensor table) read without torch or numpy: the launcher's
           --model check and memory plan read it before any worker starts; the default model's file
  convert  the Hugging Face folder of a file: one pass for llama and qwen2, transformers' loader for
           the rest; the end tokens
  cache    which cache folder a file converts to (its size and content hash), and the builder

This package's __init__ imports nothing, so that importing its header module stays torch-free.
"""
