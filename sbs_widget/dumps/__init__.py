"""steal_forward: dumping submodules' inputs and outputs into one ONNX file, restoring and comparing them."""
