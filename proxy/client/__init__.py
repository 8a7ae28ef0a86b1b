"""The client side of a request: connection guard, drain, budget, inbound, relay, replies, forward.

And the admin port, which reads the same slots.
"""
