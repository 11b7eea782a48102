"""The engines that run a program on the components: the SimPy processes
(:mod:`~sim.device.engine.processes`) and the Numba array loop (:mod:`~sim.device.engine.loop`),
both reading the components' timing rules and the program's tables."""
