// Drives a kvmesh node's OpenAI-compatible API with the official openai
// package: models, completions and chat, whole and streamed; a repeated long
// prompt reports cached_tokens > 0; errors surface as the SDK's APIError
// subclasses with the right status. cmd/kvmesh's TestOpenAISDK runs it
// against a real `kvmesh serve`:
//
//   KVMESH_BASE_URL=http://127.0.0.1:7601/v1 KVMESH_API_KEY=secret node sdk.mjs
//
// It prints one JSON line of figures and exits 0, or throws (exit 1).
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.KVMESH_BASE_URL;
assert.ok(baseURL, 'set KVMESH_BASE_URL, e.g. http://127.0.0.1:7601/v1');
const apiKey = process.env.KVMESH_API_KEY || 'unused';
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300_000 });
const model = 'kvmesh';

// A long shared prefix: several 64-token blocks.
const system = 'You are a careful assistant; answer briefly and cite the cache. '.repeat(5);

const models = await client.models.list();
assert.ok(models.data.length >= 1, 'models.list returned no model');
const modelId = models.data[0].id;

// The engine publishes a prompt's blocks in the background, right after its
// prefill; a repeat that races the publisher may still miss. Repeat a few
// times before calling it a failure.
async function repeatUntilCached(call, what) {
  for (let i = 0; i < 5; i++) {
    const r = await call();
    if (r.usage.prompt_tokens_details?.cached_tokens > 0) return r;
    await new Promise((ok) => setTimeout(ok, 200));
  }
  throw new Error(`${what}: no cached_tokens after 5 repeats`);
}

// Completions, whole.
const prompt = system + 'Question: what is a KV cache?';
const comp = { model, prompt, max_tokens: 12, temperature: 0 };
const c1 = await client.completions.create(comp);
assert.equal(c1.object, 'text_completion');
assert.equal(c1.choices.length, 1);
assert.equal(c1.choices[0].finish_reason, 'length');
assert.equal(c1.usage.prompt_tokens, Buffer.byteLength(prompt));
assert.equal(c1.usage.completion_tokens, 12);
assert.equal(c1.usage.total_tokens, c1.usage.prompt_tokens + 12);
const c2 = await repeatUntilCached(() => client.completions.create(comp), 'completion');
assert.equal(c2.choices[0].text, c1.choices[0].text, 'greedy text changed with a prefix hit');

// Completions, streamed with usage.
let streamedText = '';
let streamedUsage;
for await (const chunk of await client.completions.create({ ...comp, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) streamedUsage = chunk.usage;
  for (const ch of chunk.choices) streamedText += ch.text;
}
assert.equal(streamedText, c1.choices[0].text, 'streamed text differs from the whole answer');
assert.ok(streamedUsage?.prompt_tokens_details.cached_tokens > 0, 'streamed usage without cached tokens');

// Chat, whole, with the session hint echoed.
const messages = [
  { role: 'system', content: system },
  { role: 'user', content: 'Say hello.' },
];
const chat = { model, messages, max_tokens: 12, temperature: 0.7, seed: 11 };
const { data: h1, response } = await client.chat.completions
  .create(chat, { headers: { 'x-session-affinity': 'sdk-session-1' } })
  .withResponse();
assert.equal(response.headers.get('x-session-affinity'), 'sdk-session-1');
assert.equal(h1.object, 'chat.completion');
assert.equal(h1.choices[0].message.role, 'assistant');
assert.equal(typeof h1.choices[0].message.content, 'string');
const h2 = await repeatUntilCached(() => client.chat.completions.create(chat), 'chat');
assert.equal(h2.choices[0].message.content, h1.choices[0].message.content, 'seeded chat changed with a prefix hit');

// Chat, streamed.
let chatText = '';
let finish;
let chatUsage;
for await (const chunk of await client.chat.completions.create({ ...chat, stream: true, stream_options: { include_usage: true } })) {
  if (chunk.usage) chatUsage = chunk.usage;
  for (const ch of chunk.choices) {
    chatText += ch.delta.content ?? '';
    finish = ch.finish_reason ?? finish;
  }
}
assert.equal(chatText, h1.choices[0].message.content, 'streamed chat differs from the whole answer');
assert.equal(finish, 'length');
assert.ok(chatUsage?.prompt_tokens_details.cached_tokens > 0);

// Errors are APIError subclasses with the right status.
async function expectError(call, status, cls, what) {
  try {
    await call();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${what}: ${e} is not an APIError`);
    assert.ok(e instanceof cls, `${what}: ${e.constructor.name}, want ${cls.name}`);
    assert.equal(e.status, status, `${what}: status ${e.status}`);
    assert.ok(e.message.length > 0);
    return e;
  }
  throw new Error(`${what}: no error`);
}
await expectError(() => client.completions.create({ ...comp, model: 'gpt-4o' }), 404, OpenAI.NotFoundError, 'unknown model');
await expectError(() => client.completions.create({ ...comp, max_tokens: 0 }), 400, OpenAI.BadRequestError, 'max_tokens 0');
await expectError(() => client.completions.create({ ...comp, max_tokens: 10_000_000 }), 400, OpenAI.BadRequestError, 'huge max_tokens');
await expectError(() => client.chat.completions.create({ model, messages: [] }), 400, OpenAI.BadRequestError, 'no messages');
await expectError(
  () => client.chat.completions.create({ ...chat, stream: true, messages: [{ role: 'wizard', content: 'x' }] }),
  400, OpenAI.BadRequestError, 'bad role, streamed');
// Tool calling is refused, not ignored: the model calls no tools.
const tools = [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object', properties: {} } } }];
const te = await expectError(() => client.chat.completions.create({ ...chat, tools }), 400, OpenAI.BadRequestError, 'tools');
assert.equal(te.param, 'tools');
assert.equal(te.code, 'unsupported_parameter');
// A base URL without /v1: OpenAI's 404, saying where the API is.
const noV1 = new OpenAI({ baseURL: baseURL.replace(/\/v1\/?$/, ''), apiKey, maxRetries: 0 });
const ne = await expectError(() => noV1.chat.completions.create(chat), 404, OpenAI.NotFoundError, 'base URL without /v1');
assert.match(ne.message, /under \/v1\//);
if (process.env.KVMESH_API_KEY) {
  const wrong = new OpenAI({ baseURL, apiKey: 'not-a-token', maxRetries: 0 });
  await expectError(() => wrong.models.list(), 401, OpenAI.AuthenticationError, 'wrong key');
}

console.log(JSON.stringify({
  ok: true,
  model: modelId,
  completion_cached_tokens: c2.usage.prompt_tokens_details.cached_tokens,
  chat_cached_tokens: h2.usage.prompt_tokens_details.cached_tokens,
  prompt_tokens: c2.usage.prompt_tokens,
}));
