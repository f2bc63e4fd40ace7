-- gpufleet: per-key token quotas shared by every edge (nginx's Lua module with lua-cjson; the
-- counters in one Redis, Debian's redis-server, which the edge role runs on edge_quota_store_host).
-- Written by the edge role; configured by gpufleet_edge.load() from the root-only keys.json.
--   configure(quota, keys)  quota: {host, port, password, fail_open, timeout_ms} or nil (no store:
--                           nothing is checked or counted); keys: the key list with each key's
--                           tokens_per_minute and tokens_per_day (0 or absent: no limit)
--   check(who, fail)        access phase: a key at or over a limit gets 429 with Retry-After, before
--                           any backend is touched; the store unreachable: let through (fail_open,
--                           the default) or 503
--   prepare(who, model, body, doc)  access phase: a stream asks its backend for its usage
--                           (stream_options.include_usage), and the usage chunk is taken out of the
--                           answer for a client that did not ask for it
--   body_filter(), log()    the answer's usage (the engine's own: prompt + completion tokens) is
--                           added to the key's counters, by each worker once a second
--   stats()                 the edge's own counters (store errors, tokens it could not count)
-- Counters: gq:m:KEY:MINUTE and gq:d:KEY:DAY (UTC; tokens), gu:KEY:MODEL (a hash: prompt,
-- completion, requests, estimated) and the set gu:index of "KEY MODEL".
local cjson = require "cjson.safe"

local _M = {}

local store = nil
local limits = {} -- key name -> {minute = N or nil, day = N or nil}
local pending = {} -- this worker's counts not yet sent: "KEY MODEL MINUTE DAY" -> {p, c, n, e}
local MAX_JSON = 1024 * 1024 -- a non-streamed answer decoded whole for its usage up to this size
local MAX_TAIL = 1024 * 1024 -- an SSE event longer than this: the rest of the stream passes unread
-- the paths whose streams take stream_options (OpenAI's chat and completions); the others' streams
-- carry their usage in their own events (responses, messages)
local USAGE_OPTION = { ["/v1/chat/completions"] = true, ["/v1/completions"] = true }

local function stat(name, n)
  local dict = ngx.shared.gpufleet_quota
  if dict then
    dict:incr(name, n or 1, 0)
  end
end

function _M.configure(quota, keys)
  store, limits = nil, {}
  if type(quota) ~= "table" or not quota.host then
    return
  end
  store = {
    host = quota.host, port = tonumber(quota.port) or 6379, password = quota.password or "",
    fail_open = quota.fail_open ~= false, timeout = tonumber(quota.timeout_ms) or 250,
  }
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

-- Redis's protocol (RESP2), enough for the commands below
local function encode(args)
  local out = { "*" .. #args .. "\r\n" }
  for _, a in ipairs(args) do
    a = tostring(a)
    out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return table.concat(out)
end

local function reply(sock)
  local line, err = sock:receive("*l")
  if not line then
    return nil, err
  end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == "+" then
    return rest
  elseif kind == ":" then
    return tonumber(rest)
  elseif kind == "-" then
    return nil, "the store answered: " .. rest
  elseif kind == "$" then
    local n = tonumber(rest)
    if not n or n < 0 then
      return ngx.null
    end
    local data, rerr = sock:receive(n + 2)
    if not data then
      return nil, rerr
    end
    return data:sub(1, n)
  elseif kind == "*" then
    local n = tonumber(rest)
    if not n or n < 0 then
      return ngx.null
    end
    local list = {}
    for i = 1, n do
      local v, verr = reply(sock)
      if v == nil then
        return nil, verr
      end
      list[i] = v
    end
    return list
  end
  return nil, "not the store's protocol: " .. line:sub(1, 40)
end

-- Sends the commands at once (one round trip) and returns their replies, or nil and the error.
local function call(commands)
  local sock = ngx.socket.tcp()
  sock:settimeouts(store.timeout, store.timeout, store.timeout)
  local ok, err = sock:connect(store.host, store.port)
  if not ok then
    return nil, "connect to " .. store.host .. ":" .. store.port .. ": " .. tostring(err)
  end
  local out, auth = {}, false
  if store.password ~= "" and sock:getreusedtimes() == 0 then
    out[1] = encode({ "AUTH", store.password })
    auth = true
  end
  for _, c in ipairs(commands) do
    out[#out + 1] = encode(c)
  end
  local _, serr = sock:send(table.concat(out))
  if serr then
    sock:close()
    return nil, "send: " .. serr
  end
  if auth then
    local r, aerr = reply(sock)
    if r == nil then
      sock:close()
      return nil, "AUTH: " .. tostring(aerr)
    end
  end
  local replies = {}
  for i = 1, #commands do
    local r, rerr = reply(sock)
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

function _M.check(who, fail)
  local limit = store and who and limits[who.name]
  if not limit then
    return
  end
  local now = ngx.time()
  local minute, day = math.floor(now / 60), math.floor(now / 86400)
  local replies, err = call({ { "MGET", "gq:m:" .. who.name .. ":" .. minute, "gq:d:" .. who.name .. ":" .. day } })
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
  local used_m, used_d = tonumber(replies[1][1]) or 0, tonumber(replies[1][2]) or 0
  local what, used, max, wait
  if limit.day and used_d >= limit.day then
    what, used, max, wait = "tokens per day (TPD)", used_d, limit.day, 86400 - now % 86400
  elseif limit.minute and used_m >= limit.minute then
    what, used, max, wait = "tokens per min (TPM)", used_m, limit.minute, 60 - now % 60
  end
  if what then
    stat("refused_requests")
    ngx.var.gpufleet_quota = "refused"
    ngx.header["Retry-After"] = tostring(wait)
    ngx.header["x-ratelimit-limit-tokens"] = tostring(max)
    ngx.header["x-ratelimit-remaining-tokens"] = "0"
    return fail(429, string.format("Rate limit reached for key %s on %s: Limit %d, Used %d. Please try again in %ds.",
      who.name, what, max, used, wait), "tokens", "rate_limit_exceeded")
  end
end

-- A raw JSON value's end: an object without nested objects or arrays, or a literal; nil otherwise.
local function value_end(body, at)
  local c = body:sub(at, at)
  if c == "{" then
    local close = body:find("}", at, true)
    local inner = close and body:sub(at + 1, close - 1)
    if inner and not inner:find("[{%[]") then
      return close
    end
    return nil
  end
  for _, lit in ipairs({ "null", "false", "true" }) do
    if body:sub(at, at + #lit - 1) == lit then
      return at + #lit - 1
    end
  end
  return nil
end

-- The request's body with stream_options.include_usage set, or nil when it cannot be set exactly.
local function with_usage(body, doc)
  local opts = doc.stream_options
  if opts == nil then
    -- no stream_options at the top: one more member before the object's last brace
    local i = #body
    while i > 0 and body:find("^%s", i) do
      i = i - 1
    end
    if body:sub(i, i) ~= "}" then
      return nil
    end
    return body:sub(1, i - 1) .. ',"stream_options":{"include_usage":true}' .. body:sub(i)
  end
  -- the client's own stream_options, without include_usage: its one raw key's value replaced. A
  -- second such key, raw or spelled with \u escapes, could hide another: refused, never guessed.
  local _, last = body:find('"stream_options"', 1, true)
  if not last or body:find('"stream_options"', last + 1, true) then
    return nil
  end
  if body:find("\\u", 1, true) then
    local plain = body:gsub("\\u(%x%x%x%x)", function(hex)
      local n = tonumber(hex, 16)
      return n < 128 and string.char(n) or "?"
    end)
    local _, first = plain:find('"stream_options"', 1, true)
    if plain:find('"stream_options"', first + 1, true) then
      return nil
    end
  end
  local at = body:match("^%s*:%s*()", last + 1)
  local stop = at and value_end(body, at)
  if not stop then
    return nil
  end
  local merged = { include_usage = true }
  if type(opts) == "table" then
    for k, v in pairs(opts) do
      if k ~= "include_usage" then
        if type(v) == "table" then
          return nil
        end
        merged[k] = v
      end
    end
  end
  return body:sub(1, at - 1) .. cjson.encode(merged) .. body:sub(stop + 1)
end

function _M.prepare(who, model, body, doc, fail)
  if not store or not who then
    return
  end
  -- a stream cut before its usage is counted from what it sent, its prompt guessed from the body
  -- (4 bytes a token: more than the prompt's tokens, as the body holds more than the prompt)
  local ctx = { key = who.name, model = model, chunks = 0, guess = math.floor(#body / 4) }
  ngx.ctx.gpufleet_quota = ctx
  -- (also in a variable: ngx.ctx does not survive the router's fallback, an internal redirect)
  ngx.var.gpufleet_count = "count:" .. ctx.guess
  local stream = doc and doc.stream
  if stream ~= nil and stream ~= true and stream ~= false and stream ~= cjson.null then
    -- an engine takes 1 or "yes" for true too: only a boolean is read the same way here
    return fail(400, "stream must be true or false.", "invalid_request_error", nil, "stream")
  end
  if stream ~= true or not USAGE_OPTION[ngx.var.uri] then
    return
  end
  local opts = doc.stream_options
  if type(opts) == "table" and opts.include_usage == true then
    return -- the client asked for the usage chunk: it keeps it
  end
  local new = with_usage(body, doc)
  if not new then
    return fail(400, "stream_options could not be read: send it once, as a JSON object of true/false "
      .. "values.", "invalid_request_error", nil, "stream_options")
  end
  ngx.req.set_body_data(new)
  ctx.strip = true
  ngx.var.gpufleet_count = "strip:" .. ctx.guess
end

-- The request's count state: ngx.ctx, or after an internal redirect (error_page to the router's
-- fallback) rebuilt from the variables route() set; false when nothing is counted.
local function state()
  local ctx = ngx.ctx.gpufleet_quota
  if ctx == nil then
    local how, guess = (ngx.var.gpufleet_count or ""):match("^(%a+):(%d+)$")
    if how then
      ctx = { key = ngx.var.gpufleet_key, model = ngx.var.gpufleet_model, chunks = 0, strip = how == "strip",
        guess = tonumber(guess) }
    else
      ctx = false
    end
    ngx.ctx.gpufleet_quota = ctx
  end
  return ctx
end

-- An answer's or an event's usage: OpenAI's (prompt_tokens, completion_tokens; an embedding's
-- total_tokens), the Responses API's and Anthropic's (input_tokens, output_tokens, also under
-- `response` or `message` in their stream events); nil when it holds none.
local function usage_of(doc)
  if type(doc) ~= "table" then
    return nil
  end
  local u = doc.usage
  if type(u) ~= "table" then
    local inner = type(doc.response) == "table" and doc.response or type(doc.message) == "table" and doc.message
    u = inner and inner.usage
  end
  if type(u) ~= "table" then
    return nil
  end
  local p = tonumber(u.prompt_tokens) or tonumber(u.input_tokens)
  local c = tonumber(u.completion_tokens) or tonumber(u.output_tokens)
  if not c and tonumber(u.total_tokens) then
    c = math.max(tonumber(u.total_tokens) - (p or 0), 0)
  end
  if not p and not c then
    return nil
  end
  return { p or 0, c or 0 }
end

-- Two readings of one answer's usage (a stream reports it more than once, or in parts: Anthropic's
-- input tokens first, output tokens last): the larger of each.
local function merged(a, b)
  if not a then
    return b
  end
  return { math.max(a[1], b[1]), math.max(a[2], b[2]) }
end

-- One SSE event (text ending "\n\n"): its usage kept; "" when it is the usage chunk the client
-- did not ask for.
local function event(ctx, ev)
  if ev:find('"usage":{', 1, true) then
    -- (its data line: the event may start with an `event:` line)
    local doc = cjson.decode(ev:match("^data: ?(.-)%s*$") or ev:match("\ndata: ?(.-)%s*$") or "")
    local u = usage_of(doc)
    if u then
      ctx.usage = merged(ctx.usage, u)
      if ctx.strip and type(doc.choices) == "table" and next(doc.choices) == nil then
        return ""
      end
      return ev
    end
  end
  if not ev:find("data: [DONE]", 1, true) then
    ctx.chunks = ctx.chunks + 1
  end
  return ev
end

-- A stream without its usage (the client left, the backend stopped, an unreadable answer): each
-- event it sent counted as one completion token (an engine step sends one or more) and the prompt
-- guessed from the request's body; nil when it sent nothing.
local function estimate(ctx)
  if ctx.usage or ctx.chunks == 0 then
    return ctx.usage
  end
  ctx.usage, ctx.estimated = { ctx.guess or 0, ctx.chunks }, true
  return ctx.usage
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
  if ctx.sse == nil then
    ctx.sse = ngx.status == 200 and (ngx.header["Content-Type"] or ""):find("text/event-stream", 1, true) ~= nil
    ctx.json = ngx.status == 200 and not ctx.sse
    ctx.parts, ctx.size = {}, 0
  end
  local chunk, eof = ngx.arg[1], ngx.arg[2]
  if ctx.sse then
    local data = (ctx.tail or "") .. chunk
    local out, pos = {}, 1
    while true do
      local _, e = data:find("\n\n", pos, true)
      if not e then
        break
      end
      out[#out + 1] = event(ctx, data:sub(pos, e))
      pos = e + 1
    end
    ctx.tail = data:sub(pos)
    if eof or #ctx.tail > MAX_TAIL then
      -- (no event boundary in 1 MB: not SSE as read here; the rest passes, its chunks counted)
      out[#out + 1] = ctx.tail
      ctx.tail = nil
      if not eof then
        ctx.sse, ctx.json = false, false
        ctx.chunks = ctx.chunks + 1
      end
    end
    ngx.arg[1] = table.concat(out)
  elseif ctx.json then
    if ctx.size + #chunk <= MAX_JSON then
      ctx.parts[#ctx.parts + 1] = chunk
      ctx.size = ctx.size + #chunk
    else
      -- past the limit: the end is kept (usage is the answer's last member but for prompt_logprobs)
      ctx.parts, ctx.size = { (table.concat(ctx.parts) .. chunk):sub(-65536) }, MAX_JSON
      ctx.cut = true
    end
    if eof then
      local text = table.concat(ctx.parts)
      ctx.parts = nil
      if ctx.cut then
        -- (the last `"usage":` of the answer's end: a raw key, as a string's quotes are escaped)
        local at = text:match('.*"usage":()')
        local obj = at and text:match("^%s*({[^{}]*)", at)
        local p = obj and (obj:match('"prompt_tokens":%s*(%d+)') or obj:match('"input_tokens":%s*(%d+)'))
        local c = obj and (obj:match('"completion_tokens":%s*(%d+)') or obj:match('"output_tokens":%s*(%d+)'))
        local t = obj and obj:match('"total_tokens":%s*(%d+)')
        if p or c or t then
          p, c = tonumber(p) or 0, tonumber(c) or math.max((tonumber(t) or 0) - (tonumber(p) or 0), 0)
          ctx.usage = { p, c }
        end
      else
        ctx.usage = usage_of(cjson.decode(text))
      end
    end
  end
  if eof then
    local u = ctx.usage or estimate(ctx)
    if u then
      ngx.var.gpufleet_tokens = u[1] + u[2]
    end
  end
end

local function flush(premature)
  if not next(pending) then
    return
  end
  local batch = pending
  pending = {}
  local commands, index = {}, {}
  for id, n in pairs(batch) do
    local key, model, minute, day = id:match("^(%S+) (%S+) (%d+) (%d+)$")
    local tokens = n[1] + n[2]
    local m, d, u = "gq:m:" .. key .. ":" .. minute, "gq:d:" .. key .. ":" .. day, "gu:" .. key .. ":" .. model
    commands[#commands + 1] = { "INCRBY", m, tokens }
    commands[#commands + 1] = { "EXPIRE", m, 120 }
    commands[#commands + 1] = { "INCRBY", d, tokens }
    commands[#commands + 1] = { "EXPIRE", d, 2 * 86400 }
    commands[#commands + 1] = { "HINCRBY", u, "prompt", n[1] }
    commands[#commands + 1] = { "HINCRBY", u, "completion", n[2] }
    commands[#commands + 1] = { "HINCRBY", u, "requests", n[3] }
    commands[#commands + 1] = { "HINCRBY", u, "estimated", n[4] }
    index[key .. " " .. model] = true
  end
  local members = { "SADD", "gu:index" }
  for m in pairs(index) do
    members[#members + 1] = m
  end
  commands[#commands + 1] = members
  local replies, err = call(commands)
  if not replies then
    local lost = 0
    for _, n in pairs(batch) do
      lost = lost + n[1] + n[2]
    end
    failed(premature and "count, at exit" or "count", err)
    stat("uncounted_tokens", lost)
  end
end

function _M.log()
  local ctx = state()
  -- (a client that left never lets the body filter see the answer's end)
  local u = ctx and (ctx.usage or estimate(ctx))
  if not u or u[1] + u[2] == 0 then
    return
  end
  local now = ngx.time()
  local id = ctx.key .. " " .. ctx.model .. " " .. math.floor(now / 60) .. " " .. math.floor(now / 86400)
  local n = pending[id]
  if not n then
    n = { 0, 0, 0, 0 }
    pending[id] = n
  end
  n[1], n[2], n[3] = n[1] + u[1], n[2] + u[2], n[3] + 1
  if ctx.estimated then
    n[4] = n[4] + 1
  end
  if ngx.worker.exiting() then
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
  local out = { store = store and (store.host .. ":" .. store.port) or cjson.null }
  for _, k in ipairs({ "store_errors", "unchecked_requests", "refused_requests", "uncounted_tokens" }) do
    out[k] = dict and dict:get(k) or 0
  end
  if store then
    local replies = call({ { "PING" } })
    out.store_up = replies ~= nil
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(out))
end

return _M
