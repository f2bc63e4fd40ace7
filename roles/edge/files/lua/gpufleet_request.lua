-- gpufleet: reading what a request asks for at the edge, in time linear in its size. Pure
-- functions over strings (no nginx here): gpufleet_edge.lua and gpufleet_quota.lua call them in
-- the access phase, and tests/lua runs them with plain LuaJIT and lua-cjson.
--   raw_key(body, name, init)   where the value of the next raw top-level-or-not `"name":` key
--                               starts (a key, not text inside a string), or nil
--   scan_model(body)            the model of a JSON body by one plain scan, or nil when the scan
--                               cannot be sure (the body is decoded then)
--   form_fields(body, ctype, name)  the values of every multipart form field called `name`
--   with_usage(body, doc)       the body with stream_options.include_usage set, or nil
--   guess(body, form, audio_rate)  the prompt's tokens guessed from the body (never less)
--   reserve(path, body, doc, form, settings)  the tokens to reserve at admission
local cjson = require "cjson.safe"

local _M = {}

local find, sub, byte, match = string.find, string.sub, string.byte, string.match
local floor, ceil, max = math.floor, math.ceil, math.max

local BACKSLASH = 92

-- Where the value of the next raw `"NAME":` starts, from init; nil if there is none. A plain
-- search (memchr speed: a pattern search would try every position of a long prompt). Inside a
-- JSON string every quote is escaped, so a quote not after a backslash starts a key or a string;
-- followed by `:` it is a key.
function _M.raw_key(body, name, init)
  local key = '"' .. name .. '"'
  init = init or 1
  while true do
    local s, last = find(body, key, init, true)
    if not s then
      return nil
    end
    if s == 1 or byte(body, s - 1) ~= BACKSLASH then
      local value = match(body, "^[ \t\r\n]*:[ \t\r\n]*()", last + 1)
      if value then
        return value
      end
    end
    init = last + 1
  end
end

-- Fast path: one raw `"model":` in the body, with a plain string value, and no \u escape
-- anywhere. Inside a JSON string a quote is always escaped, so that text is a key, and without
-- \u no other key can spell "model"; when it is the only one, the hosts it routes to serve one
-- model, which is what their engine serves whatever it reads (a body naming another model is
-- refused there). Two or more (a nested "model" key, a duplicate), an escaped value or none:
-- nil, and the caller decodes the whole body.
function _M.scan_model(body)
  if find(body, "\\u", 1, true) then
    return nil
  end
  local value = _M.raw_key(body, "model", 1)
  if not value or _M.raw_key(body, "model", value) then
    return nil
  end
  return match(body, '^"([^"\\]*)"', value)
end

-- The multipart boundary of a Content-Type, or nil.
local function boundary(ctype)
  local lower = ctype:lower()
  local at = find(lower, "boundary=", 1, true)
  if not at then
    return nil
  end
  return match(ctype, '^"([^"]+)"', at + 9) or match(ctype, "^([^;%s]+)", at + 9)
end

-- A part's field name from its headers (Content-Disposition: form-data; name="x"), or nil.
local function field_name(headers)
  local at = find(headers:lower(), "content-disposition", 1, true)
  local line = at and match(headers, "^[^:\r\n]*:([^\r\n]*)", at)
  if not line then
    return nil
  end
  -- (the parameter's name in any case, its value as it is)
  local lower = line:lower()
  local s = find(lower, ";[ \t]*name[ \t]*=[ \t]*")
  if not s then
    return nil
  end
  local _, e = find(lower, ";[ \t]*name[ \t]*=[ \t]*", s)
  return match(line, '^"([^"]*)"', e + 1) or match(line, "^([^;%s]+)", e + 1)
end

-- a part's headers longer than this: not a form as engines read it
local MAX_HEADERS = 16384

-- The values of every field NAME of a multipart form (in order), or nil and why the body is not
-- a form. The parts are found with plain searches for the boundary (linear); each part's
-- headers are read within MAX_HEADERS.
function _M.form_fields(body, ctype, name)
  local b = boundary(ctype or "")
  if not b then
    return nil, "no boundary in the Content-Type"
  end
  local delim = "--" .. b
  local values = {}
  local s, e = find(body, delim, 1, true)
  if s ~= 1 and s then
    -- (a preamble before the first boundary: the boundary then follows a line break)
    s, e = find(body, "\r\n" .. delim, 1, true)
  end
  while s do
    if sub(body, e + 1, e + 2) == "--" then
      break -- the closing boundary
    end
    local hs = e + 1
    local he = find(body, "\r\n\r\n", e + 1, true)
    if not he or he - hs > MAX_HEADERS then
      return nil, "a part's headers do not end"
    end
    local headers = sub(body, hs, he - 1)
    local ns, ne = find(body, "\r\n" .. delim, he + 4, true)
    if field_name(headers) == name then
      values[#values + 1] = sub(body, he + 4, (ns or (#body + 1)) - 1)
    end
    s, e = ns, ne
  end
  return values
end

-- A raw JSON value's end: an object without nested objects or arrays, or a literal; nil otherwise.
local function value_end(body, at)
  local c = sub(body, at, at)
  if c == "{" then
    local close = find(body, "}", at, true)
    if close and not find(sub(body, at + 1, close - 1), "[{%[]") then
      return close
    end
    return nil
  end
  for _, lit in ipairs({ "null", "false", "true" }) do
    if sub(body, at, at + #lit - 1) == lit then
      return at + #lit - 1
    end
  end
  return nil
end

local USAGE_ON = '"stream_options":{"include_usage":true}'

-- The request's body with stream_options.include_usage set, or nil when it cannot be set exactly.
-- doc is the body decoded. Without stream_options the member goes in first, after the opening
-- brace (a search for the first byte that is not a space: linear, whatever pads the body). With
-- the client's own, its one raw value is replaced, and the edited body is decoded again to check
-- that a parser that keeps the last of two keys (Python's, cjson's) reads include_usage there: a
-- second stream_options spelled with \u escapes is refused, never guessed.
function _M.with_usage(body, doc)
  local opts = doc.stream_options
  if opts == nil then
    local first = find(body, "[^ \t\r\n]")
    if not first or byte(body, first) ~= 123 then
      return nil
    end
    local after = find(body, "[^ \t\r\n]", first + 1)
    local sep = (after and byte(body, after) == 125) and "" or ","
    return sub(body, 1, first) .. USAGE_ON .. sep .. sub(body, first + 1)
  end
  local value = _M.raw_key(body, "stream_options", 1)
  if not value or _M.raw_key(body, "stream_options", value) then
    return nil
  end
  local stop = value_end(body, value)
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
  local new = sub(body, 1, value - 1) .. cjson.encode(merged) .. sub(body, stop + 1)
  local check = cjson.decode(new)
  if type(check) ~= "table" or type(check.stream_options) ~= "table" or check.stream_options.include_usage ~= true then
    return nil
  end
  return new
end

-- The prompt's tokens guessed from the request's body: a JSON body at 4 bytes a token (more than
-- its prompt's tokens, as the body holds more than the prompt); a form (audio) by its size at
-- 16,000 bytes a second (128 kbit/s) and audio_rate tokens a second.
function _M.guess(bytes, form, audio_rate)
  if form then
    return ceil(bytes / 16000 * (audio_rate or 0))
  end
  return floor(bytes / 4)
end

-- the largest whole number among the body's raw NAME keys, or nil
local function raw_number(body, name)
  local best, init = nil, 1
  while true do
    local value = _M.raw_key(body, name, init)
    if not value then
      return best
    end
    local n = tonumber(match(body, "^(%d+)", value))
    if n and (not best or n > best) then
      best = n
    end
    init = value
  end
end

-- The paths that generate text (their answers' length is the request's max tokens); the others
-- (embeddings, rerank, score, audio) answer in proportion to their input.
local GENERATES = {
  ["/v1/chat/completions"] = true, ["/v1/completions"] = true, ["/v1/responses"] = true, ["/v1/messages"] = true,
}
local LIMITS = { "max_completion_tokens", "max_tokens", "max_output_tokens" }

-- The tokens a request may use, reserved against its key's quota when it is admitted and
-- settled against what it used when it ends: the prompt's guess, and for a path that generates
-- text its max tokens (max_completion_tokens, max_tokens or max_output_tokens; default_out when
-- it names none), times n. doc: the decoded body, or nil (its raw keys are read instead).
function _M.reserve(path, bytes, body, doc, form, audio_rate, default_out)
  local tokens = _M.guess(bytes, form, audio_rate)
  if GENERATES[path] then
    local out, n = nil, 1
    for _, name in ipairs(LIMITS) do
      local v
      if type(doc) == "table" then
        v = tonumber(doc[name])
      elseif body then
        v = raw_number(body, name)
      end
      if v and v > 0 then
        out = max(out or 0, floor(v))
      end
    end
    if type(doc) == "table" and tonumber(doc.n) and tonumber(doc.n) > 1 then
      n = floor(tonumber(doc.n))
    end
    tokens = tokens + (out or default_out or 0) * n
  end
  return max(tokens, 1)
end

return _M
