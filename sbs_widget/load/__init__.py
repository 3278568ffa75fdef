"""Reading what the user hands over: programs, ONNX models, inputs; checks on untrusted files; the ONNX index."""
