-- Helpers for the Lua specs: fixtures (tests/fixtures/lua, and the usage store's shared one) and
-- chunking.
local _M = {}

local root = os.getenv("GPUFLEET_ROOT") or "."

function _M.read(path)
  local f = assert(io.open(root .. "/" .. path, "rb"))
  local data = f:read("*a")
  f:close()
  return data
end

function _M.fixture(name)
  return _M.read("tests/fixtures/lua/" .. name)
end

function _M.pieces(text, step)
  local out = {}
  for i = 1, #text, step do
    out[#out + 1] = text:sub(i, i + step - 1)
  end
  return out
end

return _M
