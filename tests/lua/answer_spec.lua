-- gpufleet_answer.lua (the edge's reading of answers) with plain LuaJIT and lua-cjson: every
-- shape of usage an engine sends, split at every byte, and answers far over a megabyte.
local answer = require "gpufleet_answer"
local helpers = require "helpers"

local function scan_all(text, step, rate)
  local st = answer.scanner(rate or 10)
  for _, piece in ipairs(helpers.pieces(text, step)) do
    answer.scan(st, piece)
  end
  return st.usage, st
end

describe("reading", function()
  it("reads OpenAI's, the Responses API's, Anthropic's and an embedding's usage", function()
    assert.same({ 12, 18 }, answer.reading({ prompt_tokens = 12, completion_tokens = 18, total_tokens = 30 }))
    assert.same({ 7, 3 }, answer.reading({ input_tokens = 7, output_tokens = 3 }))
    assert.same({ 9, 0 }, answer.reading({ prompt_tokens = 9, total_tokens = 9 }))
    assert.same({ 0, 11 }, answer.reading({ total_tokens = 11 }))
  end)
  it("counts audio by its duration at the given tokens a second", function()
    assert.same({ 125, 0 }, answer.reading({ type = "duration", seconds = 12.5 }, 10))
    assert.same({ 0, 0 }, answer.reading({ type = "duration", seconds = 0 }, 10))
  end)
  it("takes no reading from an object without tokens", function()
    assert.is_nil(answer.reading({ type = "string" }))
    assert.is_nil(answer.reading("usage"))
    assert.is_nil(answer.reading({ prompt_tokens = -4 }))
  end)
end)

describe("scan", function()
  local chat = helpers.fixture("chat_prompt_logprobs.json")
  it("finds the usage of an answer split at every byte and in every chunk size", function()
    for step = 1, #chat do
      local u = scan_all(chat, step)
      assert.same({ 35, 6 }, u, "chunks of " .. step)
    end
  end)
  it("ignores a usage key inside a string (the model's text, a logprob's token)", function()
    local u = scan_all('{"choices":[{"text":"\\"usage\\":{\\"prompt_tokens\\":999}"}],'
      .. '"logprobs":{"top_logprobs":[{"\\"usage":-0.5}]},"usage":{"prompt_tokens":3,"completion_tokens":4}}', 1)
    assert.same({ 3, 4 }, u)
  end)
  it("reads usage before a rerank's echoed documents and after a chat's prompt logprobs, past 1 MB", function()
    local docs = {}
    for i = 1, 3000 do
      docs[i] = string.format('{"index":%d,"document":{"text":"%s"},"relevance_score":0.5}', i, string.rep("d", 500))
    end
    local rerank = '{"id":"rerank-1","model":"m","usage":{"total_tokens":4242},"results":['
      .. table.concat(docs, ",") .. "]}"
    assert.is_true(#rerank > 1024 * 1024)
    assert.same({ 0, 4242 }, (scan_all(rerank, 8192)))
    local logprobs = {}
    for i = 1, 40000 do
      logprobs[i] = string.format('{"%d":{"logprob":-1.5,"rank":1,"decoded_token":"tok"}}', i)
    end
    local long = '{"id":"c","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":40000,'
      .. '"total_tokens":40002,"completion_tokens":2},"prompt_logprobs":[null,' .. table.concat(logprobs, ",") .. "]}"
    assert.is_true(#long > 1024 * 1024)
    assert.same({ 40000, 2 }, (scan_all(long, 4096)))
  end)
  it("reads the Responses API's usage inside its response, and a transcription's duration", function()
    assert.same({ 5, 6 }, (scan_all('{"type":"response.completed","response":{"id":"r","usage":null,'
      .. '"tools":[{"parameters":{"properties":{"usage":{"type":"string"}}}}],'
      .. '"usage":{"input_tokens":5,"output_tokens":6,"total_tokens":11}}}', 3)))
    assert.same({ 31, 0 }, (scan_all('{"text":"hello","usage":{"type":"duration","seconds":3.1}}', 2, 10)))
  end)
  it("takes spaces around the colon, and gives up on an object longer than KEEP", function()
    assert.same({ 1, 2 }, (scan_all('{"usage" : \n {"prompt_tokens": 1, "completion_tokens": 2}}', 1)))
    local huge = '{"usage":{"x":"' .. string.rep("a", answer.KEEP) .. '"},"usage":{"prompt_tokens":8}}'
    assert.same({ 8, 0 }, (scan_all(huge, 100)))
  end)
  it("keeps no more than a usage object and a few bytes between chunks", function()
    local st = answer.scanner(10)
    answer.scan(st, '{"a":"' .. string.rep("x", 100000))
    assert.is_true(#st.carry < 8)
    answer.scan(st, '","usage":{"prompt_tokens":1,')
    assert.is_true(st.size < answer.KEEP)
    answer.scan(st, '"completion_tokens":2}}')
    assert.same({ 1, 2 }, st.usage)
  end)
end)

describe("split", function()
  local function run(chunks, hold, on_event)
    local st = answer.splitter(hold)
    local out = {}
    for _, c in ipairs(chunks) do
      out[#out + 1] = answer.split(st, c, on_event or function(ev) return ev end)
    end
    out[#out + 1] = answer.rest(st)
    return table.concat(out), st, out
  end
  local stream = helpers.fixture("chat_stream.txt")
  it("passes a stream whole, split at every byte, and counts its events", function()
    for step = 1, 40 do
      local text, st = run(helpers.pieces(stream, step), answer.HOLD)
      assert.equal(stream, text)
      assert.equal(7, st.events, "chunks of " .. step)
    end
  end)
  it("takes out the usage chunk the client did not ask for", function()
    for step = 1, 40 do
      local text = run(helpers.pieces(stream, step), answer.HOLD, function(ev)
        return ev:find('"choices":[]', 1, true) and "" or ev
      end)
      assert.is_nil(text:find('"usage"', 1, true))
      assert.is_truthy(text:find("data: [DONE]\n\n", 1, true))
    end
  end)
  it("sends an event longer than hold on as it comes, and goes on splitting after it", function()
    local first = "data: " .. string.rep("p", 3 * 1024 * 1024) .. "\n\n"
    local chunks = helpers.pieces(first .. stream, 8192)
    local st = answer.splitter(answer.HOLD)
    local sent = 0
    for i, c in ipairs(chunks) do
      sent = sent + #answer.split(st, c, function(ev) return ev end)
      if i * 8192 < #first then
        -- never more than hold bytes behind what came in
        assert.is_true(i * 8192 - sent <= answer.HOLD, "chunk " .. i)
      end
    end
    sent = sent + #answer.rest(st)
    assert.equal(#first + #stream, sent)
    assert.equal(8, st.events)
  end)
end)

describe("estimate", function()
  it("counts an answer without usage from its events or bytes, never 0 once anything was sent", function()
    assert.same({ 100, 7 }, answer.estimate(100, 7, 5000))
    assert.same({ 100, 3 }, answer.estimate(100, 0, 9))
    assert.same({ 0, 1 }, answer.estimate(0, nil, 1))
    assert.is_nil(answer.estimate(100, 0, 0))
  end)
end)
