"""Models to try and test on: dummy_llm, the zoo of small transformers/vision models, fault injection, the demo."""
