"""Code that the patched upstream files call into.

The patches stay a few lines each; the logic they trigger lives here, where it is typed and
tested. Importing this package (or any module in it) must never import torch_npu, vllm or
verl: the vLLM worker imports it before CANN is checked, and the tests import it on CPU.
"""
