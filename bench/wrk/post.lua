-- wrk script: POST the JSON body in the file given after `--`, and print one JSON line of
-- results from the `done` hook (bench/run.py parses the line that starts with BENCH_JSON).
local body_path = nil

function init(args)
  body_path = args[1]
end

-- setup() runs per thread before init(); the body is read once per thread in request().
local request_bytes = nil

function request()
  if request_bytes == nil then
    local f = assert(io.open(body_path, "rb"))
    local body = f:read("*a")
    f:close()
    request_bytes = wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
  end
  return request_bytes
end

function done(summary, latency, requests)
  local e = summary.errors
  local p = {}
  for _, q in ipairs({50, 90, 99, 99.9}) do
    p[#p + 1] = string.format('"%s":%d', tostring(q), latency:percentile(q))
  end
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,'
      .. '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},'
      .. '"latency_us":{"min":%d,"mean":%.1f,"max":%d,"stdev":%.1f,"percentiles":{%s}}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.min, latency.mean, latency.max, latency.stdev, table.concat(p, ",")))
end
