-- gpufleet: the usage store's key layout and protocol (Redis's RESP2), once for the edge's Lua.
-- (The other side, gpufleet-usage in Python, has its own copy; tests/fixtures/usage_store.json
-- holds the keys and bytes both must produce, and each side's tests read it.)
--   key.minute(KEY, MINUTE), key.day(KEY, DAY), key.usage(KEY, MODEL), key.index
--                           gq:m:KEY:MINUTE and gq:d:KEY:DAY: a key's tokens in a UTC minute or
--                           day (minutes and days since the epoch); gu:KEY:MODEL: a hash of
--                           prompt, completion, requests and estimated; gu:index: the set of
--                           "KEY MODEL" that have one
--   encode(args)            one command as RESP2 bytes
--   read_reply(recv)        one reply, read with recv(pattern_or_count) (a cosocket's receive)
--   admit(KEY, MINUTE, DAY, TOKENS)   the commands that reserve TOKENS in both windows
--   release(KEY, MINUTE, DAY, TOKENS) the commands that give them back (a refused request)
--   counts(batch)           the commands that add a batch of settled counts
local _M = {}

local concat, tostring, tonumber = table.concat, tostring, tonumber

-- how long each window's counter outlives its window (seconds)
_M.MINUTE_TTL = 120
_M.DAY_TTL = 2 * 86400

_M.key = {
  minute = function(key, minute)
    return "gq:m:" .. key .. ":" .. minute
  end,
  day = function(key, day)
    return "gq:d:" .. key .. ":" .. day
  end,
  usage = function(key, model)
    return "gu:" .. key .. ":" .. model
  end,
  index = "gu:index",
}

function _M.encode(args)
  local out = { "*" .. #args .. "\r\n" }
  for _, a in ipairs(args) do
    a = tostring(a)
    out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return concat(out)
end

-- One reply: a status (string), an integer, a bulk string, an array, or null (the value `null`
-- given); nil and the error for an error reply or a broken connection.
function _M.read_reply(recv, null)
  local line, err = recv("*l")
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
      return null
    end
    local data, rerr = recv(n + 2)
    if not data then
      return nil, rerr
    end
    return data:sub(1, n)
  elseif kind == "*" then
    local n = tonumber(rest)
    if not n or n < 0 then
      return null
    end
    local list = {}
    for i = 1, n do
      local v, verr = _M.read_reply(recv, null)
      if v == nil then
        return nil, verr
      end
      list[i] = v
    end
    return list
  end
  return nil, "not the store's protocol: " .. line:sub(1, 40)
end

-- Reserve TOKENS in KEY's minute and day (replies: the minute's total, 1, the day's total, 1).
function _M.admit(key, minute, day, tokens)
  local m, d = _M.key.minute(key, minute), _M.key.day(key, day)
  return {
    { "INCRBY", m, tokens }, { "EXPIRE", m, _M.MINUTE_TTL },
    { "INCRBY", d, tokens }, { "EXPIRE", d, _M.DAY_TTL },
  }
end

function _M.release(key, minute, day, tokens)
  return { { "DECRBY", _M.key.minute(key, minute), tokens }, { "DECRBY", _M.key.day(key, day), tokens } }
end

-- The commands for a batch of counts: {[{key, model, minute, day}] = {prompt, completion,
-- requests, estimated, reserved}} as a list of {id = {key, model, minute, day}, n = {...}}. The
-- windows take what was used less what was reserved at admission (settled); the usage hash
-- takes what was used.
function _M.counts(batch)
  local commands, index = {}, {}
  for _, item in ipairs(batch) do
    local id, n = item.id, item.n
    local key, model, minute, day = id[1], id[2], id[3], id[4]
    local delta = n[1] + n[2] - (n[5] or 0)
    if delta ~= 0 then
      local m, d = _M.key.minute(key, minute), _M.key.day(key, day)
      commands[#commands + 1] = { "INCRBY", m, delta }
      commands[#commands + 1] = { "EXPIRE", m, _M.MINUTE_TTL }
      commands[#commands + 1] = { "INCRBY", d, delta }
      commands[#commands + 1] = { "EXPIRE", d, _M.DAY_TTL }
    end
    if n[3] > 0 or n[1] + n[2] > 0 then
      local u = _M.key.usage(key, model)
      commands[#commands + 1] = { "HINCRBY", u, "prompt", n[1] }
      commands[#commands + 1] = { "HINCRBY", u, "completion", n[2] }
      commands[#commands + 1] = { "HINCRBY", u, "requests", n[3] }
      commands[#commands + 1] = { "HINCRBY", u, "estimated", n[4] }
      index[#index + 1] = key .. " " .. model
    end
  end
  if #index > 0 then
    local members = { "SADD", _M.key.index }
    for _, m in ipairs(index) do
      members[#members + 1] = m
    end
    commands[#commands + 1] = members
  end
  return commands
end

return _M
