-- gpufleet_request.lua (the edge's reading of requests) with plain LuaJIT and lua-cjson.
local cjson = require "cjson.safe"
local request = require "gpufleet_request"

describe("scan_model", function()
  it("reads one raw model key with a plain value", function()
    assert.equal("tiny-llama", request.scan_model('{"model": "tiny-llama","messages":[]}'))
  end)
  it("gives up (the body is decoded) on two, an escaped value, none, or any \\u", function()
    assert.is_nil(request.scan_model('{"model":"a","x":{"model":"b"}}'))
    assert.is_nil(request.scan_model('{"model":"a\\"b"}'))
    assert.is_nil(request.scan_model('{"prompt":"x"}'))
    assert.is_nil(request.scan_model('{"model":"a","prompt":"\\u00e9"}'))
  end)
  it("does not take a key that ends in an escaped quote and \"model\" for the model", function()
    -- the key a"model (raw: "a\"model") holds the text "model": followed by a colon
    assert.equal("real", request.scan_model('{"a\\"model":"evil","model":"real"}'))
  end)
end)

describe("form_fields", function()
  local ctype = "multipart/form-data; boundary=XyZ"
  local function form(parts)
    local out = {}
    for _, p in ipairs(parts) do
      out[#out + 1] = "--XyZ\r\n" .. p[1] .. "\r\n\r\n" .. p[2] .. "\r\n"
    end
    return table.concat(out) .. "--XyZ--\r\n"
  end
  it("reads each field called model, quoted or not, in order", function()
    local body = form({
      { 'Content-Disposition: form-data; name="file"; filename="a.wav"\r\nContent-Type: audio/wav', "RIFF\0\0model" },
      { 'content-disposition: form-data; name="model"', "whisper-small" },
      { "Content-Disposition: form-data; name=model", "other" },
    })
    assert.same({ "whisper-small", "other" }, request.form_fields(body, ctype, "model"))
    assert.same({ "whisper-small" }, request.form_fields(form({ { 'Content-Disposition: form-data; name="model"',
      "whisper-small" } }), 'multipart/form-data; boundary="XyZ"', "model"))
  end)
  it("does not take filename= for name=", function()
    local body = form({ { 'Content-Disposition: form-data; filename="model"; name="file"', "x" } })
    assert.same({}, request.form_fields(body, ctype, "model"))
  end)
  it("says when there is no boundary", function()
    local values, err = request.form_fields("x", "multipart/form-data", "model")
    assert.is_nil(values)
    assert.matches("boundary", err)
  end)
end)

describe("with_usage", function()
  local function decoded(body)
    return assert(cjson.decode(body))
  end
  it("adds stream_options first, in time linear in the body whatever pads it", function()
    local body = '  {"model":"m","stream":true}' .. string.rep(" \n", 3000000)
    local new = request.with_usage(body, decoded(body))
    local want = '  {"stream_options":{"include_usage":true},"model":"m","stream":true}'
    assert.equal(want, new:sub(1, #want))
    assert.equal(#body + #'"stream_options":{"include_usage":true},', #new)
    assert.same({ include_usage = true }, decoded(new).stream_options)
  end)
  it("sets include_usage in the client's own options, keeping the others", function()
    local body = '{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}'
    local new = request.with_usage(body, decoded(body))
    assert.same({ include_usage = true, continuous_usage_stats = false }, decoded(new).stream_options)
    body = '{"model":"m","stream":true,"stream_options": null}'
    assert.same({ include_usage = true }, decoded(request.with_usage(body, decoded(body))).stream_options)
  end)
  it("refuses a second stream_options, raw or spelled with escapes, and nested values", function()
    local body = '{"stream_options":{"x":true},"stream":true,"\\u0073tream_options":{"include_usage":false}}'
    assert.is_nil(request.with_usage(body, decoded(body)))
    body = '{"stream_options":{"a":{"b":1}},"stream":true}'
    assert.is_nil(request.with_usage(body, decoded(body)))
    body = '{"stream_options":null,"stream":true,"stream_options":{}}'
    assert.is_nil(request.with_usage(body, decoded(body)))
  end)
  it("keeps a \\u in the prompt", function()
    local body = '{"prompt":"caf\\u00e9","stream":true,"stream_options":null}'
    local new = request.with_usage(body, decoded(body))
    assert.equal("caf\195\169", decoded(new).prompt)
  end)
end)

describe("reserve", function()
  it("reserves the prompt's guess and the max tokens, times n", function()
    local body = string.rep("x", 400)
    assert.equal(100 + 50, request.reserve("/v1/chat/completions", #body, body, { max_tokens = 50 }, false, 10, 1024))
    assert.equal(100 + 30 * 2, request.reserve("/v1/completions", #body, body,
      { max_completion_tokens = 30, n = 2 }, false, 10, 1024))
    assert.equal(100 + 1024, request.reserve("/v1/responses", #body, body, {}, false, 10, 1024))
    assert.equal(100, request.reserve("/v1/embeddings", #body, body, { max_tokens = 50 }, false, 10, 1024))
  end)
  it("reads raw max tokens keys when the body was not decoded (the largest)", function()
    local body = '{"model":"m","max_tokens": 77,"x":{"max_tokens":5}}'
    assert.equal(math.floor(#body / 4) + 77, request.reserve("/v1/chat/completions", #body, body, nil, false, 10, 1024))
  end)
  it("guesses an audio form by its size, at least 1", function()
    assert.equal(10, request.reserve("/v1/audio/transcriptions", 16000, nil, nil, true, 10, 1024))
    assert.equal(1, request.reserve("/v1/embeddings", 0, "", nil, false, 10, 1024))
  end)
end)
