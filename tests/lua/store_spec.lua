-- gpufleet_store.lua: the usage store's keys and protocol, against the fixture gpufleet-usage's
-- tests read too (tests/fixtures/usage_store.json).
local cjson = require "cjson"
local store = require "gpufleet_store"
local helpers = require "helpers"

local shared = cjson.decode(helpers.read("tests/fixtures/usage_store.json"))

local function reader(bytes)
  local pos = 1
  return function(what)
    if what == "*l" then
      local e = bytes:find("\r\n", pos, true)
      if not e then
        return nil, "closed"
      end
      local line = bytes:sub(pos, e - 1)
      pos = e + 2
      return line
    end
    if pos + what - 1 > #bytes then
      return nil, "closed"
    end
    local data = bytes:sub(pos, pos + what - 1)
    pos = pos + what
    return data
  end
end

describe("the key layout", function()
  it("names each key as the shared fixture does", function()
    for _, k in ipairs(shared.keys) do
      assert.equal(k.minute_key, store.key.minute(k.key, k.minute))
      assert.equal(k.day_key, store.key.day(k.key, k.day))
      assert.equal(k.usage_key, store.key.usage(k.key, k.model))
    end
    assert.equal(shared.index, store.key.index)
  end)
end)

describe("the protocol", function()
  it("encodes each command as the shared fixture does", function()
    for _, c in ipairs(shared.commands) do
      assert.equal(c.bytes, store.encode(c.args))
    end
  end)
  it("reads each reply as the shared fixture does (null as the given value)", function()
    for _, r in ipairs(shared.replies) do
      assert.same(r.value, store.read_reply(reader(r.bytes), cjson.null))
    end
    for _, r in ipairs(shared.errors) do
      local v, err = store.read_reply(reader(r.bytes), cjson.null)
      assert.is_nil(v)
      assert.equal(r.message, err)
    end
  end)
  it("reports a connection closed mid-reply", function()
    local v, err = store.read_reply(reader("*2\r\n$3\r\nab"), cjson.null)
    assert.is_nil(v)
    assert.equal("closed", err)
  end)
end)

describe("the commands", function()
  local k = shared.keys[1]
  it("reserve in both windows and give back the same", function()
    assert.same({
      { "INCRBY", k.minute_key, 140 }, { "EXPIRE", k.minute_key, 120 },
      { "INCRBY", k.day_key, 140 }, { "EXPIRE", k.day_key, 172800 },
    }, store.admit(k.key, k.minute, k.day, 140))
    assert.same({ { "DECRBY", k.minute_key, 140 }, { "DECRBY", k.day_key, 140 } },
      store.release(k.key, k.minute, k.day, 140))
  end)
  it("settle a batch: the windows take what was used less what was reserved, the usage hash what was used", function()
    local commands = store.counts({
      { id = { k.key, k.model, k.minute, k.day }, n = { 30, 20, 1, 0, 140 } },
      -- a refused request's reservation alone: given back, no usage
      { id = { "other", "m", 5, 0 }, n = { 0, 0, 0, 0, 7 } },
      -- settled exactly: the windows unchanged, the usage counted
      { id = { "exact", "m", 5, 0 }, n = { 3, 4, 1, 1, 7 } },
    })
    assert.same({
      { "INCRBY", k.minute_key, -90 }, { "EXPIRE", k.minute_key, 120 },
      { "INCRBY", k.day_key, -90 }, { "EXPIRE", k.day_key, 172800 },
      { "HINCRBY", k.usage_key, "prompt", 30 }, { "HINCRBY", k.usage_key, "completion", 20 },
      { "HINCRBY", k.usage_key, "requests", 1 }, { "HINCRBY", k.usage_key, "estimated", 0 },
      { "INCRBY", "gq:m:other:5", -7 }, { "EXPIRE", "gq:m:other:5", 120 },
      { "INCRBY", "gq:d:other:0", -7 }, { "EXPIRE", "gq:d:other:0", 172800 },
      { "HINCRBY", "gu:exact:m", "prompt", 3 }, { "HINCRBY", "gu:exact:m", "completion", 4 },
      { "HINCRBY", "gu:exact:m", "requests", 1 }, { "HINCRBY", "gu:exact:m", "estimated", 1 },
      { "SADD", "gu:index", k.member, "exact m" },
    }, commands)
  end)
end)
