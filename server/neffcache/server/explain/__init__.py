"""Why a graph missed: the reasons, the program map, and the explanation."""
