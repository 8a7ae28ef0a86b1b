"""vllm-sidecar: a reverse proxy for vLLM that resolves model names and never fails silently.

The package is a house with floors, each folder a layer that imports only those below it
(docs/layers.md has the map and one request's path through it; `make lint` keeps it true):

    pod/       --workers N: the supervisor, its workers, the typed messages between them
    wiring/    one process: settings -> create_app -> the server; reconciling with vLLM
    client/    a request's side: bounds, reading, the flow, relaying, continuing, the admin port
    engine/    the engine lifecycle: state, version history, holds, each request's handle, tallies
    upstream/  the vLLM side: the two clients (lean/, aiohttp's), discovery, the probe
    observe/   metrics, logs, the request record
    core/      pure decisions: routes, resolution, phases, errors and the envelope, headers,
               SSE, continuation's plan and joining, off-policy arithmetic
    config/    Settings, read by the wiring and the pod only

`proxy.skyrl` stands apart: SkyRL's companions, which need nothing of the rest.

The house's own words (plane, hold, stamp, straddle, tally, span, continuation and continuing,
flow, relay, hop, lean, ...) each name one thing: the glossary is at the end of docs/layers.md.
"""

__version__ = "0.1.0"
