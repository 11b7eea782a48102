"""Model presets: Hugging Face ``config.json`` files and kvsim-schema TOML files."""
