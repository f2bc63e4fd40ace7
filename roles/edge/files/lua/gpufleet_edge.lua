-- gpufleet: the edge's model routing and key scopes (nginx's Lua module, Debian's
-- libnginx-mod-http-lua with lua-cjson). Written by the edge role; loaded once by nginx's master
-- (init_by_lua, as root: it reads the root-only key file), so the workers hold the tables.
--   load(MODELS_JSON, KEYS_JSON)  models.json: {"models": [{name, upstream, card}], "paths": [...],
--                                 "keys_required": bool}; keys.json: {"keys": [{name, key, models}]}
--                                 (keys_required false: no key check; true and no file: nginx fails)
--   route(via_router)  access phase: a path outside the inference paths is 404; reads the request's
--                      `model`, checks the caller's key and its scope, sets $gpufleet_upstream (that
--                      model's backends) and $gpufleet_model; answers 400/401/404 itself, before any
--                      backend is touched. via_router: the router picks the instance by its own reading
--                      of the body, so the whole body is decoded (never the scan) and a top-level
--                      model is required when several are served.
--                      With a usage store (edge_quota_store_host), gpufleet_quota.lua checks the
--                      key's token quota here too and counts the answer's usage.
--   list()             content phase: GET /v1/models and /v1/models/ID from the models it serves,
--                      each once, only those the caller's key may use (without edge keys, to a
--                      caller whose key a proxy accepts: /_gpufleet/key-check).
local cjson = require "cjson.safe"
local quota = require "gpufleet_quota"
local request = require "gpufleet_request"

local _M = {}

local models, by_name, keys, paths, limits = {}, {}, {}, {}, {}
local default_model = nil
local check_keys = false

local function read(path)
  local f = io.open(path, "rb")
  if not f then
    return nil
  end
  local data = f:read("*a")
  f:close()
  return data
end

function _M.load(models_path, keys_path)
  local text = read(models_path)
  local conf, err = cjson.decode(text or "")
  if type(conf) ~= "table" or type(conf.models) ~= "table" then
    error("gpufleet edge: " .. models_path .. " is not the edge's model list: " .. tostring(err or "no models"))
  end
  models, by_name, keys, paths, limits = conf.models, {}, {}, {}, {}
  for _, path in ipairs(conf.paths or {}) do
    paths[path] = true
  end
  for path, bytes in pairs(type(conf.limits) == "table" and conf.limits or {}) do
    limits[path] = tonumber(bytes)
  end
  for _, m in ipairs(models) do
    by_name[m.name] = m
  end
  -- one model: a request that names none goes to it (the engine's own default, as before)
  default_model = (#models == 1) and models[1] or nil
  quota.configure(nil)
  local ktext = read(keys_path)
  if conf.keys_required and not ktext then
    -- never fail open: without its key list the edge would let every key reach every model
    error("gpufleet edge: " .. keys_path .. " cannot be read, and models.json says the edge checks keys")
  end
  if ktext then
    local kconf = cjson.decode(ktext)
    if type(kconf) ~= "table" or type(kconf.keys) ~= "table" then
      error("gpufleet edge: " .. keys_path .. " is not the edge's key list")
    end
    for _, k in ipairs(kconf.keys) do
      local scope = nil -- nil: every model
      if type(k.models) == "table" and #k.models > 0 then
        scope = {}
        for _, name in ipairs(k.models) do
          scope[name] = true
        end
      end
      keys[k.key] = { name = k.name, scope = scope }
    end
    quota.configure(kconf.quota, kconf.keys)
  end
  check_keys = next(keys) ~= nil
end

-- An OpenAI-style error, answered here (no backend is touched).
local function fail(status, message, kind, code, param)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  if status == 401 then
    ngx.header["WWW-Authenticate"] = 'Bearer realm="gpufleet"'
  end
  ngx.say(cjson.encode({ error = {
    message = message, type = kind, param = param or cjson.null, code = code or cjson.null,
  } }))
  return ngx.exit(status)
end

-- The caller's key entry (nil when the edge checks no key: the proxies check them).
local function caller()
  if not check_keys then
    return nil
  end
  local auth = ngx.var.http_authorization
  local key = auth and auth:match("^[Bb]earer%s+(%S+)%s*$")
  local who = key and keys[key]
  if not who then
    return fail(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
  end
  ngx.var.gpufleet_key = who.name
  return who
end

local function allowed(who, name)
  return who == nil or who.scope == nil or who.scope[name] == true
end

local function unknown(name)
  if #name > 256 then
    name = name:sub(1, 256) .. "..."
  end
  return fail(404, "The model `" .. name .. "` does not exist or you do not have access to it.",
    "invalid_request_error", "model_not_found", "model")
end

-- The body's `model`: JSON (chat, completions, embeddings, responses, ...) or a multipart form
-- field (audio). Returns the name (nil: none), whether the body was not JSON, the decoded body
-- (when it was decoded), whether it is a form; or fails the request (a form with two models).
local function model_of(body, exact)
  if not body or body == "" then
    return nil, false
  end
  local ctype = ngx.var.content_type or ""
  if ctype:lower():find("multipart/form-data", 1, true) then
    local values = request.form_fields(body, ctype, "model")
    if values and #values > 1 then
      -- the edge would route by one and an engine (Starlette's form) read another
      return fail(400, "The form has " .. #values .. " model fields: send one.", "invalid_request_error", nil, "model")
    end
    return values and values[1], false, nil, true
  end
  -- the scan (direct to the proxies only: the router reads the body itself) keeps a long
  -- prompt's cost to one plain search; a body it cannot be sure of is decoded
  local name = not exact and request.scan_model(body)
  if name then
    return name, false
  end
  local doc = cjson.decode(body)
  if type(doc) ~= "table" then
    return nil, true
  end
  name = doc.model
  if name == nil or name == cjson.null then
    return nil, false, doc
  end
  return tostring(name), false, doc
end

-- The body cap of a path (models.json's limits, bytes): 413 before the body is read when its
-- length says so, or after (a chunked body).
local function too_large(uri, size)
  local cap = limits[uri] or limits.default
  if cap and size and size > cap then
    return fail(413, string.format("The request body is %d bytes, over the %d this endpoint (%s) accepts.", size, cap,
      uri), "invalid_request_error", "request_too_large")
  end
end

function _M.route(via_router)
  local uri = ngx.var.uri
  if not paths[uri] then
    -- not an inference path (the router's and the engines' control paths included): never sent on
    return fail(404, "Invalid URL (" .. ngx.req.get_method() .. " " .. uri .. ")", "invalid_request_error")
  end
  local who = caller()
  local name, bad_json, doc, form = nil, false, nil, false
  local body = nil
  local method = ngx.req.get_method()
  if method ~= "GET" and method ~= "HEAD" then
    too_large(uri, tonumber(ngx.var.http_content_length))
    ngx.req.read_body()
    body = ngx.req.get_body_data()
    if not body then
      local file = ngx.req.get_body_file()
      body = file and read(file)
    end
    too_large(uri, body and #body)
    name, bad_json, doc, form = model_of(body, via_router)
  end
  local m
  if name == nil then
    m = default_model
    if not m then
      if bad_json then
        return fail(400, "We could not parse the JSON body of your request.", "invalid_request_error")
      end
      return fail(400, "You must provide a model parameter.", "invalid_request_error", nil, "model")
    end
    if not allowed(who, m.name) then
      return unknown(m.name)
    end
  else
    m = by_name[name]
    if not m or not allowed(who, name) then
      return unknown(name)
    end
  end
  ngx.var.gpufleet_upstream = m.upstream
  ngx.var.gpufleet_model = m.name
  if quota.enabled() and who then
    -- the key's token quota (429 before any backend), then its usage counted from the answer
    if body and body ~= "" and not doc and not form and body:find('"stream"', 1, true) then
      -- the scan read the model: a raw "stream" key may ask for a stream
      doc = cjson.decode(body)
      if type(doc) ~= "table" then
        -- (an engine may still read it, a byte order mark before it, say: its stream would go uncounted)
        return fail(400, "We could not parse the JSON body of your request.", "invalid_request_error")
      end
    end
    quota.admit(who, m.name, body, doc, form, fail)
  end
end

-- init_worker, header and body filters, log: the quota's (nothing without a usage store)
_M.start = quota.start
_M.header_filter = quota.header_filter
_M.body_filter = quota.body_filter
_M.log = quota.log
_M.quota_stats = quota.stats

function _M.list()
  local who = caller()
  if not check_keys then
    -- the proxies check the keys: the list is shown to a caller one of them accepts
    local res = ngx.location.capture("/_gpufleet/key-check")
    if res.status ~= 200 then
      ngx.status = res.status
      ngx.header["Content-Type"] = "application/json"
      ngx.header["WWW-Authenticate"] = res.header["WWW-Authenticate"]
      ngx.print(res.body)
      return ngx.exit(res.status)
    end
  end
  local cards = {}
  for _, m in ipairs(models) do
    if allowed(who, m.name) then
      cards[#cards + 1] = m.card
    end
  end
  ngx.header["Content-Type"] = "application/json"
  local uri = ngx.var.uri
  if uri == "/v1/models" or uri == "/v1/models/" then
    if #cards == 0 then
      ngx.say('{"object":"list","data":[]}')
    else
      ngx.say(cjson.encode({ object = "list", data = cards }))
    end
    return
  end
  local id = uri:sub(#"/v1/models/" + 1) -- ($uri is decoded already)
  for _, card in ipairs(cards) do
    if card.id == id then
      ngx.say(cjson.encode(card))
      return
    end
  end
  return unknown(id)
end

return _M
