"""What the runner adds to RLlib's algorithms: the AlgorithmConfig built from the
settings, the fast off-policy step and its replay, reward scaling, SB3-sized SAC, and the
trained policies' loading and ONNX export."""
