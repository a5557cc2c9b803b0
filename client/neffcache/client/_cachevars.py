"""The settings a cache URL is read from (config.py) and the schemes that turn
neffcache on: named once for ``_log``'s start-up check and ``_typos``'s messages,
in a module of their own so that neither imports the other to share them."""

URL_SETTINGS = ("NEFFCACHE_URL", "NEURON_COMPILE_CACHE_URL")
FLAGS_SETTING = "NEURON_CC_FLAGS"
CACHE_URL_SCHEMES = ("neffcache+http://", "neffcache+https://")
