-- gpufleet: per-key token quotas shared by every edge (nginx's Lua module with lua-cjson; the
-- counters in one Redis, Debian's redis-server, which the edge role runs on edge_quota_store_host).
-- The nginx-facing layer: what it reads of requests and answers is in gpufleet_request.lua and
-- gpufleet_answer.lua, the store's keys and protocol in gpufleet_store.lua (pure, unit-tested).
-- Written by the edge role; configured by gpufleet_edge.load() from the root-only keys.json.
--   configure(quota, keys)  quota: {host, port, password, fail_open, timeout_ms, tls,
--                           audio_tokens_per_second, reserve_tokens} or nil (no store: nothing is
--                           checked or counted); tls: {certificate, key, name} (the store with
--                           more than one edge: the fleet CA's client certificate, the store's
--                           name), read here as root; keys: the key list with each key's
--                           tokens_per_minute and tokens_per_day (0 or absent: no limit)
--   admit(who, model, body, doc, form, fail)  access phase: a stream asks its backend for its
--                           usage (stream_options.include_usage), and the usage chunk is taken
--                           out for a client that did not ask for it; a key with a limit has the
--                           request's tokens reserved in the store at once (one atomic INCRBY a
--                           window): a key at or over a limit before it gets 429 with
--                           Retry-After, before any backend is touched; the store unreachable:
--                           let through (fail_open, the default) or 503
--   header_filter(), body_filter(), log()  the answer's usage (the engine's own: prompt +
--                           completion tokens) read as it passes, added to the key's counters
--                           (less what was reserved) by each worker once a second
--   stats()                 the edge's own counters (store errors, tokens it could not count)
local cjson = require "cjson.safe"
local answer = require "gpufleet_answer"
local request = require "gpufleet_request"
local proto = require "gpufleet_store"

local _M = {}

local store = nil
local limits = {} -- key name -> {minute = N or nil, day = N or nil}
local pending = {} -- this worker's counts not yet sent: "KEY\nMODEL\nMINUTE\nDAY" -> {p, c, n, e, reserved}
local client = nil -- the TLS client certificate and key, parsed once in each worker
-- the paths whose streams take stream_options (OpenAI's chat and completions); the others' streams
-- carry their usage in their own events (responses, messages)
local USAGE_OPTION = { ["/v1/chat/completions"] = true, ["/v1/completions"] = true }

local function stat(name, n)
  local dict = ngx.shared.gpufleet_quota
  if dict then
    dict:incr(name, n or 1, 0)
  end
end

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then
    error("gpufleet quota: cannot read " .. tostring(path) .. ": " .. tostring(err))
  end
  local data = f:read("*a")
  f:close()
  return data
end

function _M.configure(quota, keys)
  store, limits, client = nil, {}, nil
  if type(quota) ~= "table" or not quota.host then
    return
  end
  store = {
    host = quota.host, port = tonumber(quota.port) or 6379, password = quota.password or "",
    fail_open = quota.fail_open ~= false, timeout = tonumber(quota.timeout_ms) or 250,
    audio_rate = tonumber(quota.audio_tokens_per_second) or 10,
    reserve_tokens = tonumber(quota.reserve_tokens) or 1024,
  }
  if type(quota.tls) == "table" then
    -- (the master reads them as root; each worker parses them when it first connects)
    store.tls = { name = quota.tls.name, cert = read(quota.tls.certificate), key = read(quota.tls.key) }
  end
  for _, k in ipairs(keys or {}) do
    local m, d = tonumber(k.tokens_per_minute) or 0, tonumber(k.tokens_per_day) or 0
    if m > 0 or d > 0 then
      limits[k.name] = { minute = m > 0 and m or nil, day = d > 0 and d or nil }
    end
  end
end

function _M.enabled()
  return store ~= nil
end

local function connect()
  local sock = ngx.socket.tcp()
  sock:settimeouts(store.timeout, store.timeout, store.timeout)
  local ok, err = sock:connect(store.host, store.port)
  if not ok then
    return nil, "connect to " .. store.host .. ":" .. store.port .. ": " .. tostring(err)
  end
  if sock:getreusedtimes() > 0 then
    return sock, nil, true
  end
  if store.tls then
    if not client then
      local ssl = require "ngx.ssl"
      local cert, cerr = ssl.parse_pem_cert(store.tls.cert)
      local key, kerr = ssl.parse_pem_priv_key(store.tls.key)
      if not cert or not key then
        sock:close()
        return nil, "the store's client certificate: " .. tostring(cerr or kerr)
      end
      client = { cert = cert, key = key }
    end
    ok, err = sock:setclientcert(client.cert, client.key)
    if ok then
      -- verified against lua_ssl_trusted_certificate (the fleet CA), by the store's name
      ok, err = sock:sslhandshake(nil, store.tls.name, true)
    end
    if not ok then
      sock:close()
      return nil, "TLS with the store: " .. tostring(err)
    end
  end
  return sock, nil, false
end

-- Sends the commands at once (one round trip) and returns their replies, or nil and the error.
local function call(commands)
  local sock, err, reused = connect()
  if not sock then
    return nil, err
  end
  local out, auth = {}, false
  if store.password ~= "" and not reused then
    out[1] = proto.encode({ "AUTH", store.password })
    auth = true
  end
  for _, c in ipairs(commands) do
    out[#out + 1] = proto.encode(c)
  end
  local _, serr = sock:send(table.concat(out))
  if serr then
    sock:close()
    return nil, "send: " .. serr
  end
  local function recv(what)
    return sock:receive(what)
  end
  if auth then
    local r, aerr = proto.read_reply(recv, ngx.null)
    if r == nil then
      sock:close()
      return nil, "AUTH: " .. tostring(aerr)
    end
  end
  local replies = {}
  for i = 1, #commands do
    local r, rerr = proto.read_reply(recv, ngx.null)
    if r == nil then
      sock:close()
      return nil, rerr
    end
    replies[i] = r
  end
  sock:setkeepalive(60000, 32)
  return replies
end

local function failed(what, err)
  stat("store_errors")
  ngx.log(ngx.WARN, "gpufleet quota: the usage store failed (", what, "): ", err)
end

-- how (count, or strip: the usage chunk taken out too), the prompt's guess and the reservation,
-- in a variable too: ngx.ctx does not survive the router's fallback, an internal redirect
local function remember(ctx)
  ngx.var.gpufleet_count = string.format("%s:%d:%d:%d:%d", ctx.strip and "strip" or "count", ctx.guess,
    ctx.reserved, ctx.minute or 0, ctx.day or 0)
end

-- The key's quota: the request's tokens reserved in both windows at once; refused (and given
-- back) when the key had used its limit before it.
local function reserve(ctx, who, tokens, fail)
  local limit = limits[who.name]
  if not limit then
    return
  end
  local now = ngx.time()
  local minute, day = math.floor(now / 60), math.floor(now / 86400)
  local replies, err = call(proto.admit(who.name, minute, day, tokens))
  if not replies then
    failed("check", err)
    if store.fail_open then
      stat("unchecked_requests")
      ngx.var.gpufleet_quota = "unchecked"
      return
    end
    ngx.var.gpufleet_quota = "unavailable"
    ngx.header["Retry-After"] = "5"
    return fail(503, "The edge cannot read the key's token quota now; try again shortly.", "server_error",
      "quota_unavailable")
  end
  local used_m, used_d = (tonumber(replies[1]) or 0) - tokens, (tonumber(replies[3]) or 0) - tokens
  local what, used, max, wait
  if limit.day and used_d >= limit.day then
    what, used, max, wait = "tokens per day (TPD)", used_d, limit.day, 86400 - now % 86400
  elseif limit.minute and used_m >= limit.minute then
    what, used, max, wait = "tokens per min (TPM)", used_m, limit.minute, 60 - now % 60
  end
  if what then
    local _, rerr = call(proto.release(who.name, minute, day, tokens))
    if rerr then
      failed("release", rerr)
    end
    stat("refused_requests")
    ngx.var.gpufleet_quota = "refused"
    ngx.header["Retry-After"] = tostring(wait)
    ngx.header["x-ratelimit-limit-tokens"] = tostring(max)
    ngx.header["x-ratelimit-remaining-tokens"] = "0"
    return fail(429, string.format("Rate limit reached for key %s on %s: Limit %d, Used %d. Please try again in %ds.",
      who.name, what, max, used, wait), "tokens", "rate_limit_exceeded")
  end
  ctx.reserved, ctx.minute, ctx.day = tokens, minute, day
  remember(ctx)
end

function _M.admit(who, model, body, doc, form, fail)
  if not store or not who then
    return
  end
  body = body or ""
  local uri = ngx.var.uri
  -- a stream cut before its usage, or an answer without one, is counted from what it sent, its
  -- prompt guessed from the body
  local ctx = { key = who.name, model = model, guess = request.guess(#body, form, store.audio_rate), reserved = 0 }
  ngx.ctx.gpufleet_quota = ctx
  remember(ctx)
  local stream = doc and doc.stream
  if stream ~= nil and stream ~= true and stream ~= false and stream ~= cjson.null then
    -- an engine takes 1 or "yes" for true too: only a boolean is read the same way here
    return fail(400, "stream must be true or false.", "invalid_request_error", nil, "stream")
  end
  if stream == true and USAGE_OPTION[uri] then
    local opts = doc.stream_options
    if not (type(opts) == "table" and opts.include_usage == true) then
      -- (a client that asked for the usage chunk keeps it)
      local new = request.with_usage(body, doc)
      if not new then
        return fail(400, "stream_options could not be read: send it once, as a JSON object of true/false "
          .. "values.", "invalid_request_error", nil, "stream_options")
      end
      ngx.req.set_body_data(new)
      ctx.strip = true
      remember(ctx)
    end
  end
  reserve(ctx, who, request.reserve(uri, #body, body, doc, form, store.audio_rate, store.reserve_tokens), fail)
end

-- The request's count state: ngx.ctx, or after an internal redirect (error_page to the router's
-- fallback) rebuilt from the variable remember() set; false when nothing is counted.
local function state()
  local ctx = ngx.ctx.gpufleet_quota
  if ctx == nil then
    local how, guess, reserved, minute, day = (ngx.var.gpufleet_count or ""):match("^(%a+):(%d+):(%d+):(%d+):(%d+)$")
    if how then
      ctx = { key = ngx.var.gpufleet_key, model = ngx.var.gpufleet_model, strip = how == "strip",
        guess = tonumber(guess), reserved = tonumber(reserved), minute = tonumber(minute), day = tonumber(day) }
      if ctx.reserved == 0 then
        ctx.minute, ctx.day = nil, nil
      end
    else
      ctx = false
    end
    ngx.ctx.gpufleet_quota = ctx
  end
  return ctx
end

-- the usage chunk a client did not ask for (choices empty, usage set): taken out; any other
-- event passes as it is
local function strip_usage(ev)
  if not ev:find('"usage"', 1, true) then
    return ev
  end
  local at = ev:find("data:", 1, true)
  local doc = at and cjson.decode(ev:sub(at + 5))
  if type(doc) == "table" and type(doc.usage) == "table" and type(doc.choices) == "table"
    and next(doc.choices) == nil then
    return ""
  end
  return ev
end

local function keep(ev)
  return ev
end

-- The usage, or for an answer without it an estimate (ctx.estimated); nil when nothing was sent.
local function used(ctx)
  if ctx.usage then
    return ctx.usage
  end
  if not ctx.answered then
    return nil
  end
  local u = answer.estimate(ctx.guess, ctx.split and ctx.split.events, ctx.bytes)
  if u then
    ctx.usage, ctx.estimated = u, true
  end
  return u
end

function _M.header_filter()
  local ctx = state()
  if ctx and ctx.strip then
    -- the usage chunk may be taken out: the length is no longer the backend's
    ngx.header["Content-Length"] = nil
  end
end

function _M.body_filter()
  local ctx = state()
  if not ctx then
    return
  end
  if ctx.answered == nil then
    -- only an answer counts: an error (the engine refused the request) used no tokens
    ctx.answered = ngx.status == 200
    if ctx.answered then
      ctx.scan = answer.scanner(store and store.audio_rate)
      ctx.bytes = 0
      if (ngx.header["Content-Type"] or ""):find("text/event-stream", 1, true) then
        ctx.split = answer.splitter(answer.HOLD)
      end
    end
  end
  if not ctx.answered then
    return
  end
  local chunk, eof = ngx.arg[1], ngx.arg[2]
  if chunk and chunk ~= "" then
    ctx.bytes = ctx.bytes + #chunk
    answer.scan(ctx.scan, chunk)
    if ctx.split then
      ngx.arg[1] = answer.split(ctx.split, chunk, ctx.strip and strip_usage or keep)
    end
  end
  if eof then
    if ctx.split then
      ngx.arg[1] = (ngx.arg[1] or "") .. answer.rest(ctx.split)
    end
    ctx.usage = ctx.scan.usage
    local u = used(ctx)
    if u then
      ngx.var.gpufleet_tokens = u[1] + u[2]
    end
  end
end

local function flush(premature)
  if not next(pending) then
    return
  end
  local batch = {}
  for id, n in pairs(pending) do
    local key, model, minute, day = id:match("^([^\n]*)\n([^\n]*)\n(%d+)\n(%d+)$")
    batch[#batch + 1] = { id = { key, model, minute, day }, n = n }
  end
  pending = {}
  local commands = proto.counts(batch)
  if #commands == 0 then
    return
  end
  local replies, err = call(commands)
  if not replies then
    local lost = 0
    for _, item in ipairs(batch) do
      lost = lost + item.n[1] + item.n[2]
    end
    failed(premature and "count, at exit" or "count", err)
    stat("uncounted_tokens", lost)
  end
end

function _M.log()
  local ctx = state()
  if not ctx then
    return
  end
  -- (a client that left never lets the body filter see the answer's end: the usage read so far,
  -- else an estimate)
  if not ctx.usage and ctx.scan then
    ctx.usage = ctx.scan.usage
  end
  local u = ctx.usage or (ctx.answered and used(ctx))
  local tokens = u and (u[1] + u[2]) or 0
  if tokens == 0 and ctx.reserved == 0 then
    return
  end
  local now = ngx.time()
  -- settled in the windows it was reserved in
  local minute, day = ctx.minute or math.floor(now / 60), ctx.day or math.floor(now / 86400)
  local id = ctx.key .. "\n" .. ctx.model .. "\n" .. minute .. "\n" .. day
  local n = pending[id]
  if not n then
    n = { 0, 0, 0, 0, 0 }
    pending[id] = n
  end
  n[5] = n[5] + ctx.reserved
  if tokens > 0 then
    n[1], n[2], n[3] = n[1] + u[1], n[2] + u[2], n[3] + 1
    if ctx.estimated then
      n[4] = n[4] + 1
    end
  end
  if ctx.reserved > 0 or ngx.worker.exiting() then
    -- a reservation is settled at once (until then the store holds the reservation, not the use);
    -- a reload: this worker's once-a-second timer has run its last, so this count goes now
    ngx.timer.at(0, flush)
  end
end

-- init_worker: each worker sends its counts once a second (and when it exits)
function _M.start()
  if store then
    ngx.timer.every(1, flush)
  end
end

function _M.stats()
  local dict = ngx.shared.gpufleet_quota
  local out = { store = store and (store.host .. ":" .. store.port) or cjson.null, tls = store and store.tls ~= nil }
  for _, k in ipairs({ "store_errors", "unchecked_requests", "refused_requests", "uncounted_tokens" }) do
    out[k] = dict and dict:get(k) or 0
  end
  if store then
    local replies, err = call({ { "PING" } })
    out.store_up = replies ~= nil
    if not replies then
      out.store_error = err
    end
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(out))
end

return _M
