"""STAND-IN for the ``libneuronxla`` package; this is NOT AWS's code (whose source is not
public, neuron-cache-facts.md section 0).

Written only from neuron-cache-facts.md sections 1, 2, 3, 4, 5, 6, 8 and 9. The modules
are ``libncc`` (``NEURON_CC_FLAGS`` parsing), ``neuron_cc_cache`` (the cache) and
``neuron_cc_wrapper`` (``neuron_xla_compile`` and friends).

``CacheUrl``, ``create_compile_cache`` and ``neuron_xla_compile`` are re-exported here,
so ``libneuronxla.create_compile_cache`` is one more binding of the function (section 9:
callers patch it "everywhere it was imported").
"""

from libneuronxla.neuron_cc_cache import CacheUrl, create_compile_cache
from libneuronxla.neuron_cc_wrapper import neuron_xla_compile

__all__ = ["CacheUrl", "create_compile_cache", "neuron_xla_compile"]
