"""STAND-IN for the ``libneuronxla`` package; this is NOT AWS's code (whose source is not
public, docs/neuron-sdk.md#provenance).

Written only from these sections of docs/neuron-sdk.md: #where-the-cache-sits,
#cache-location, #entry-layout, #stock-address, #neuronx-cc-invocation-and-outputs,
#locking, #neuron_parallel_compile and #libneuronxla-cache-api. The modules are
``libncc`` (``NEURON_CC_FLAGS`` parsing), ``neuron_cc_cache`` (the cache) and
``neuron_cc_wrapper`` (``neuron_xla_compile`` and friends).

``CacheUrl``, ``create_compile_cache`` and ``neuron_xla_compile`` are re-exported here,
so ``libneuronxla.create_compile_cache`` is one more binding of the function
(#libneuronxla-cache-api: callers patch it "everywhere it was imported").
"""

from libneuronxla.neuron_cc_cache import CacheUrl, create_compile_cache
from libneuronxla.neuron_cc_wrapper import neuron_xla_compile

__all__ = ["CacheUrl", "create_compile_cache", "neuron_xla_compile"]
