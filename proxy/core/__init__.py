"""Pure decisions, no sockets: routes, model resolution, phases, errors, the envelope, headers.

Also SSE framing and the JSON scan that finds a body's model. Nothing here does I/O or imports
another layer.
"""
