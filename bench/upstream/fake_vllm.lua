-- A fake vLLM for the bench: fixed vLLM-0.32.0-shaped JSON and SSE (see shared/vllm-samples),
-- served from LuaJIT inside nginx so the upstream costs almost nothing.
-- Every completion request is checked: a body whose `model` is not the served name gets vLLM's
-- own 404, so a proxy that did not rewrite the model shows up as errors, never as speed.
local M = {}

-- CLOCK_MONOTONIC in ns, the clock the RL client (bench/streams_client.py) reads: each paced
-- event carries the time it was written, so the client sees how late every token arrives.
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now_ns()
  ffi.C.clock_gettime(1, ts)
  return string.format("%d%09d", tonumber(ts.tv_sec), tonumber(ts.tv_nsec))
end

local SERVED = "Qwen2.5-0.5B"
local ROOT = "Qwen/Qwen2.5-0.5B"
local SSE_EVENTS = 20
local CREATED = 1795982287

M.models = '{"object":"list","data":[{"id":"' .. SERVED .. '","object":"model","created":'
  .. CREATED .. ',"owned_by":"vllm","root":"' .. ROOT .. '","parent":null,"max_model_len":32768,'
  .. '"permission":[{"id":"modelperm-93ac6f08a0de1efe","object":"model_permission","created":'
  .. CREATED .. ',"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,'
  .. '"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*",'
  .. '"group":null,"is_blocking":false}]}]}'

local completion = '{"id":"cmpl-9836c2f3302586ba","object":"text_completion","created":' .. CREATED
  .. ',"model":"' .. SERVED .. '","choices":[{"index":0,"text":" the quick brown fox jumps","logprobs":null,'
  .. '"finish_reason":"length","stop_reason":null,"token_ids":null,"prompt_logprobs":null,'
  .. '"prompt_token_ids":null,"routed_experts":null}],"service_tier":null,'
  .. '"system_fingerprint":"vllm-0.32.0-d800a907","usage":{"prompt_tokens":3,"total_tokens":7,'
  .. '"completion_tokens":4,"prompt_tokens_details":null,"completion_tokens_details":null},'
  .. '"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'

local chat = '{"id":"chatcmpl-8a38b9117e56f473","object":"chat.completion","created":' .. CREATED
  .. ',"model":"' .. SERVED .. '","choices":[{"index":0,"message":{"role":"assistant","content":'
  .. '" the quick brown fox jumps","refusal":null,"annotations":null,"audio":null,"function_call":null,'
  .. '"reasoning":null},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null,'
  .. '"routed_experts":null}],"service_tier":null,"system_fingerprint":"vllm-0.32.0-d800a907",'
  .. '"usage":{"prompt_tokens":21,"total_tokens":26,"completion_tokens":5,"prompt_tokens_details":null,'
  .. '"completion_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":null,'
  .. '"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}'

-- /inference/v1/generate (token ids in and out), as vLLM 0.32 answers SkyRL 0.4's
-- RemoteInferenceClient: `GenerateTokensResponse.model_dump()` (every field, nulls included, in
-- field order), `logprobs` 1 as SkyRL's default sampling params ask, one weight-version span.
local GENERATED = 16
local function tokens_answer()
  local ids, content = {}, {}
  for i = 1, GENERATED do
    local id = 1000 + i
    ids[i] = tostring(id)
    local lp = '"token_id":' .. id .. ',"logprob":-0.' .. (100 + i) .. ',"rank":1'
    content[i] = '{' .. lp .. ',"top_logprobs":[{' .. lp .. '}]}'
  end
  return '{"request_id":"generate-tokens-9b1c2a6e0d4f4c7e8a5b3d2f1e0c9b8a","model":"' .. SERVED
    .. '","created":' .. CREATED .. ',"usage":{"prompt_tokens":256,"total_tokens":'
    .. (256 + GENERATED) .. ',"completion_tokens":' .. GENERATED .. ',"prompt_tokens_details":null},'
    .. '"prompt_logprobs":null,"prompt_token_id_logprobs":null,"prompt_token_ids":null,'
    .. '"mm_placeholders":null,"metrics":null,"kv_transfer_params":null,"ec_transfer_params":null,'
    .. '"output_mode":"tokens","choices":[{"index":0,"finish_reason":"length","stop_reason":null,'
    .. '"token_ids":[' .. table.concat(ids, ",") .. '],"routed_experts":null,"sampling_mask":null,'
    .. '"weight_versions":[{"version":"1","start":0,"end":' .. GENERATED .. '}],'
    .. '"logprobs":{"content":[' .. table.concat(content, ",") .. ']}}]}'
end
local tokens = tokens_answer()

local function sse_events(kind, count)
  local events = {}
  for i = 1, count do
    local last = i == count
    local finish = last and '"length","stop_reason":null' or "null"
    local tail = last and ',"system_fingerprint":"vllm-0.32.0-d800a907"' or ""
    if kind == "chat" then
      events[i] = 'data: {"id":"chatcmpl-8019c8be29231fcf","object":"chat.completion.chunk","created":'
        .. CREATED .. ',"model":"' .. SERVED .. '","choices":[{"index":0,"delta":{"content":" tok'
        .. i .. '"},"logprobs":null,"finish_reason":' .. finish .. ',"token_ids":null}]' .. tail
        .. '}\n\n'
    else
      events[i] = 'data: {"id":"cmpl-b4ccefe7603a02d4","object":"text_completion","created":'
        .. CREATED .. ',"model":"' .. SERVED .. '","choices":[{"index":0,"text":" tok' .. i
        .. '","logprobs":null,"finish_reason":' .. finish
        .. ',"prompt_token_ids":null,"token_ids":null}]' .. tail .. '}\n\n'
    end
  end
  events[count + 1] = "data: [DONE]\n\n"
  return events
end

local bodies = {
  ["/v1/completions"] = {json = completion, kind = "completion"},
  ["/v1/chat/completions"] = {json = chat, kind = "chat"},
}

-- Streams of N events, built once per kind and length.
local streams = {}
local function stream_of(kind, count)
  local key = kind .. count
  if streams[key] == nil then
    streams[key] = sse_events(kind, count)
  end
  return streams[key]
end

local WINDOW = 4096

-- The first match of a Lua pattern, looked for near both ends before the whole body: clients
-- put `model` and `stream` first or last, and an 8 MB token-id list sits in between.
local function find(body, pattern)
  local n = #body
  if n <= 2 * WINDOW then
    return string.match(body, pattern)
  end
  return string.match(string.sub(body, 1, WINDOW), pattern)
    or string.match(string.sub(body, n - WINDOW), pattern)
    or string.match(body, pattern)
end

local function read_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body then
    return body
  end
  local path = ngx.req.get_body_file()
  if not path then
    return ""
  end
  local f = assert(io.open(path, "rb"))
  body = f:read("*a")
  f:close()
  return body
end

local function not_found(model)
  local body = '{"error":{"message":"The model `' .. model .. '` does not exist. Valid aliases: '
    .. SERVED .. '.","type":"NotFoundError","param":"model","code":404}}'
  ngx.status = 404
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #body
  ngx.print(body)
end

-- vLLM's /pause and /resume (keep mode): while paused, a completion waits, as vLLM queues it.
function M.pause()
  ngx.shared.bench:set("paused", true)
  ngx.print("{}")
end

function M.resume()
  ngx.shared.bench:set("paused", false)
  ngx.print("{}")
end

local function wait_while_paused()
  while ngx.shared.bench:get("paused") do
    ngx.sleep(0.05)
  end
end

-- The RL shape (`"bench_pace_ms":"20-50"`): a token event every 20-50 ms, each stamped with
-- the time it was written (`"bench_t":<ns>`), flushed alone, as vLLM streams tokens.
local function paced(kind, count, lo, hi)
  local events = stream_of(kind, count)
  for i = 1, count do
    ngx.sleep((lo + math.random() * (hi - lo)) / 1000)
    ngx.print('data: {"bench_t":', now_ns(), ",", string.sub(events[i], 8))
    local ok = ngx.flush(true)
    if not ok then
      return
    end
  end
  ngx.print(events[count + 1])
end

-- SkyRL 0.4 sends `model` beside `token_ids` and `sampling_params`; a wrong one is vLLM's 404.
function M.generate_tokens()
  local body = read_body()
  wait_while_paused()
  local model = find(body, '"model"%s*:%s*"([^"]*)"') or ""
  if model ~= SERVED then
    return not_found(model)
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #tokens
  ngx.print(tokens)
end

function M.generate()
  local body = read_body()
  wait_while_paused()
  local model = find(body, '"model"%s*:%s*"([^"]*)"') or ""
  if model ~= SERVED then
    ngx.log(ngx.WARN, "wrong model: ", model)
    return not_found(model)
  end
  local route = bodies[ngx.var.uri]
  -- `%a+` rather than `true`, so that `"stream":false` near the end stops the search there.
  if find(body, '"stream"%s*:%s*(%a+)') == "true" then
    ngx.header["Content-Type"] = "text/event-stream; charset=utf-8"
    -- One chunk per event, each flushed on its own, as vLLM streams tokens.
    -- vLLM streams exactly max_tokens tokens when told to ignore EOS; otherwise SSE_EVENTS.
    local count = SSE_EVENTS
    if find(body, '"ignore_eos"%s*:%s*(%a+)') == "true" then
      count = math.min(tonumber(find(body, '"max_tokens"%s*:%s*(%d+)')) or SSE_EVENTS, 100000)
    end
    local lo, hi = find(body, '"bench_pace_ms"%s*:%s*"(%d+)%-(%d+)"')
    if lo then
      return paced(route.kind, count, tonumber(lo), tonumber(hi))
    end
    local events = stream_of(route.kind, count)
    -- `X-Bench-Burst`: the whole stream in one write, so that the proxy reads it at once and
    -- a count of its instructions does not hang on how many events piled up in its socket
    -- between two reads, which moved by 2% from run to run (bench/counting.py).
    if ngx.var.http_x_bench_burst then
      ngx.print(table.concat(events))
      return
    end
    for _, event in ipairs(events) do
      ngx.print(event)
      ngx.flush(false)
    end
    return
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #route.json  -- vLLM sends a length, not chunks, for JSON
  ngx.print(route.json)
end

return M
