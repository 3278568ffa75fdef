"""Pairing FX nodes with ONNX values: the alignment data, the pairing rules, values without a twin and why."""
