-- gpufleet: reading an answer's token usage as it passes the edge, at any size and shape. Pure
-- functions over strings (no nginx here): gpufleet_quota.lua feeds them each chunk of the body
-- filter, and tests/lua runs them with plain LuaJIT and lua-cjson.
--   scanner(audio_rate)     a state for scan(); audio_rate: tokens counted per second of audio
--   scan(st, chunk)         finds each raw `"usage": {...}` key in the bytes as they come (split
--                           anywhere across chunks) and keeps the largest reading in st.usage
--   splitter(hold)          a state for split(): SSE events of up to `hold` bytes are held whole
--   split(st, chunk, on_event)  the text to send on now: whole small events (each through
--                           on_event, which may drop one), a longer event passed on as it comes
--   reading(u, audio_rate)  {prompt, completion} from one usage object, or nil
--   estimate(...)           an answer without usage counted from what it sent, never 0
-- Work per byte is linear: plain finds and one character-class find from an explicit position;
-- nothing searches a growing buffer, and nothing is kept but a usage object (at most KEEP bytes)
-- and one held SSE event (at most `hold` bytes).
local cjson = require "cjson.safe"

local _M = {}

local find, sub, byte, concat = string.find, string.sub, string.byte, table.concat
local floor, max, ceil = math.floor, math.max, math.ceil

-- a usage object longer than this is not one (an engine's is under 300 bytes)
_M.KEEP = 4096
-- an SSE event is held whole up to this size, so that a usage chunk the client did not ask for
-- can be taken out (an engine's is under 1 KB); a longer one is passed on as it comes
_M.HOLD = 65536

local KEY = '"usage"'
local BACKSLASH, LBRACE, QUOTE, NL = 92, 123, 34, 10

local function count(v)
  v = tonumber(v)
  if not v or v ~= v or v < 0 then
    return nil
  end
  return floor(v)
end

-- One usage object's tokens as {prompt, completion}: OpenAI's (prompt_tokens, completion_tokens;
-- an embedding's or a score's total_tokens), the Responses API's and Anthropic's (input_tokens,
-- output_tokens), an audio answer's duration (vLLM: {"type": "duration", "seconds": N}, counted
-- as audio_rate tokens a second); nil when it holds none of these.
function _M.reading(u, audio_rate)
  if type(u) ~= "table" then
    return nil
  end
  local p = count(u.prompt_tokens) or count(u.input_tokens)
  local c = count(u.completion_tokens) or count(u.output_tokens)
  local total = count(u.total_tokens)
  if not c and total then
    c = max(total - (p or 0), 0)
  end
  if not p and not c then
    local seconds = u.type == "duration" and tonumber(u.seconds)
    if seconds and seconds >= 0 and seconds == seconds then
      return { ceil(seconds * (audio_rate or 0)), 0 }
    end
    return nil
  end
  return { p or 0, c or 0 }
end

-- Two readings of one answer (a stream reports its usage more than once, or in parts:
-- Anthropic's input tokens first, output tokens last): the larger of each.
function _M.merged(a, b)
  if not a then
    return b
  end
  if not b then
    return a
  end
  return { max(a[1], b[1]), max(a[2], b[2]) }
end

function _M.scanner(audio_rate)
  -- carry: the end of the last chunk that may begin a key; prev: the byte before it; obj: the
  -- pieces of a usage object being read (depth, in a string, after a backslash)
  return { carry = "", prev = nil, obj = nil, size = 0, depth = 0, instr = false, esc = false,
    usage = nil, audio_rate = audio_rate or 0, found = 0 }
end

local function finish(st, text)
  local u = _M.reading(cjson.decode(text), st.audio_rate)
  if u then
    st.usage = _M.merged(st.usage, u)
    st.found = st.found + 1
  end
end

-- Reads a usage object's bytes from data[from]; returns where scanning goes on, or nil when the
-- object goes on in the next chunk (everything up to the end was taken).
local function capture(st, data, from)
  local stop = #data
  local room = from + (_M.KEEP - st.size) - 1
  if room < stop then
    stop = room
  end
  local i = from
  if st.esc then
    st.esc = false
    i = i + 1
  end
  while i <= stop do
    if st.instr then
      local j = find(data, '[\\"]', i)
      if not j or j > stop then
        break
      end
      if byte(data, j) == BACKSLASH then
        if j == stop then
          st.esc = true
          break
        end
        i = j + 2
      else
        st.instr = false
        i = j + 1
      end
    else
      local j = find(data, '[{}"]', i)
      if not j or j > stop then
        break
      end
      local c = byte(data, j)
      if c == QUOTE then
        st.instr = true
      elseif c == LBRACE then
        st.depth = st.depth + 1
      else
        st.depth = st.depth - 1
        if st.depth == 0 then
          st.obj[#st.obj + 1] = sub(data, from, j)
          local text = concat(st.obj)
          st.obj = nil
          finish(st, text)
          return j + 1
        end
      end
      i = j + 1
    end
  end
  if stop < #data then
    -- longer than KEEP: not a usage object; scanning goes on after what was read
    st.obj, st.esc = nil, false
    return stop + 1
  end
  st.obj[#st.obj + 1] = sub(data, from)
  st.size = st.size + (#data - from + 1)
  return nil
end

-- Where a key's value starts after `"usage"` ending at e: the position of its first byte, or
-- false (not a key with an object value), or nil (the chunk ends before it is known).
local WS_LIMIT = 64
local function value_at(data, e)
  local at = e + 1
  local n = #data
  local seen_colon = false
  local stop = e + WS_LIMIT
  while at <= n do
    if at > stop then
      return false
    end
    local c = byte(data, at)
    if c == 58 and not seen_colon then -- ':'
      seen_colon = true
    elseif c ~= 32 and c ~= 9 and c ~= 10 and c ~= 13 then
      if seen_colon and c == LBRACE then
        return at
      end
      return false
    end
    at = at + 1
  end
  return nil
end

function _M.scan(st, chunk)
  if chunk == nil or chunk == "" then
    return st.usage
  end
  local data = st.carry .. chunk
  local prev = st.prev
  st.carry = ""
  local pos = 1
  if st.obj then
    pos = capture(st, data, 1)
    if not pos then
      return st.usage
    end
  end
  while true do
    local s, e = find(data, KEY, pos, true)
    if not s then
      break
    end
    local before
    if s > 1 then
      before = byte(data, s - 1)
    else
      before = prev
    end
    local at = nil
    if before ~= BACKSLASH then
      at = value_at(data, e)
      if at == nil then
        -- the chunk ends inside the key's colon and spaces: read them again with the next one
        st.prev = before
        st.carry = sub(data, s)
        return st.usage
      end
    end
    if at then
      st.obj, st.size, st.depth, st.instr, st.esc = {}, 0, 0, false, false
      pos = capture(st, data, at)
      if not pos then
        return st.usage
      end
    else
      pos = e + 1
    end
  end
  -- the last bytes may begin a key that the next chunk ends (shorter than a key: never found twice)
  local n = #data
  local keep = #KEY - 1
  if n - pos + 1 < keep then
    keep = n - pos + 1
  end
  if keep > 0 then
    st.carry = sub(data, n - keep + 1)
    st.prev = n - keep >= 1 and byte(data, n - keep) or prev
  else
    st.prev = byte(data, n)
  end
  return st.usage
end

function _M.splitter(hold)
  -- held: the current event's pieces (size bytes); passing: the current event is longer than
  -- hold and goes on as it comes; nl: the last chunk ended in "\n" outside a finished event
  return { held = {}, size = 0, passing = false, nl = false, hold = hold or _M.HOLD, events = 0 }
end

local function ended(st, piece, on_event, out)
  if st.passing then
    st.passing = false
    st.events = st.events + 1
    out[#out + 1] = piece
    return
  end
  local ev = piece
  if st.size > 0 then
    st.held[#st.held + 1] = piece
    ev = concat(st.held)
    st.held, st.size = {}, 0
  end
  if not find(ev, "data: [DONE]", 1, true) then
    st.events = st.events + 1
  end
  out[#out + 1] = on_event(ev)
end

-- The text to send on for this chunk: each finished event (held ones through on_event, which
-- returns the text to send for it, "" to drop it), a long event's bytes as they come.
function _M.split(st, chunk, on_event)
  local out = {}
  local pos = 1
  local n = #chunk
  if n == 0 then
    return ""
  end
  if st.nl and byte(chunk, 1) == NL then
    -- "\n\n" split over two chunks
    ended(st, "\n", on_event, out)
    pos = 2
  end
  while true do
    local s = find(chunk, "\n\n", pos, true)
    if not s then
      break
    end
    ended(st, sub(chunk, pos, s + 1), on_event, out)
    pos = s + 2
  end
  st.nl = false
  if pos <= n then
    local rest = sub(chunk, pos)
    st.nl = byte(rest, #rest) == NL
    if st.passing then
      out[#out + 1] = rest
    elseif st.size + #rest > st.hold then
      -- longer than any usage chunk: sent on as it comes, no longer held
      st.held[#st.held + 1] = rest
      out[#out + 1] = concat(st.held)
      st.held, st.size, st.passing = {}, 0, true
    else
      st.held[#st.held + 1] = rest
      st.size = st.size + #rest
    end
  end
  return concat(out)
end

-- What is left held when the answer ends (an event without its blank line).
function _M.rest(st)
  local text = concat(st.held)
  if st.size > 0 and not st.passing then
    st.events = st.events + 1
  end
  st.held, st.size = {}, 0
  return text
end

-- An answer without usage (a text transcription, a stream the client left, an engine that
-- reports none): the prompt guessed from the request (gpufleet_request.guess), the completion
-- from what the answer sent: a stream's events (an engine step sends one or more tokens), else
-- its bytes at 4 a token; never 0 once anything was sent.
function _M.estimate(guess, events, bytes)
  local c = events and events > 0 and events or 0
  if c == 0 and bytes and bytes > 0 then
    c = ceil(bytes / 4)
  end
  if c == 0 then
    return nil
  end
  return { guess or 0, c }
end

return _M
