"""torch.compile, applied by the runner and proven per component.

- `settings`: what is valid, checked once, and the picklable `CompileSpec`;
- `apply`: compiling inside every EnvRunner and Learner process, each method counted;
- `report`: per-component reports and the summary line;
- `onnxrt`: the runner's onnxruntime backend.
"""
