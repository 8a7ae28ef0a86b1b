"""The engine lifecycle: phases applied, the gate on each request, reconciling, stalls."""
