"""The engines that run a program on the components: the lean event kernel and the Numba
array loop."""
