// Drives a kvmesh node's asynchronous API (POST/GET/DELETE /v1/queue) with
// the official openai package. The SDK has no method for it, so the
// client's generic post/get/delete helpers carry the calls, with the SDK's
// base URL, bearer token and error classes: submit, poll until completed,
// responses equal to the same requests sent synchronously at temperature
// 0, cancel, another tenant's id is 404, bad inputs are OpenAI error
// objects with the right status, and the node keeps serving after them.
// cmd/kvmesh's TestOpenAISDKQueue runs it against a real `kvmesh serve` and
// through `kvmesh route`:
//
//   KVMESH_BASE_URL=http://127.0.0.1:7601/v1 KVMESH_API_KEY=acme \
//   KVMESH_OTHER_API_KEY=beta node queue.mjs
//
// It prints one JSON line of figures and exits 0, or throws (exit 1).
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const baseURL = process.env.KVMESH_BASE_URL;
assert.ok(baseURL, 'set KVMESH_BASE_URL, e.g. http://127.0.0.1:7601/v1');
const apiKey = process.env.KVMESH_API_KEY || 'unused';
const otherKey = process.env.KVMESH_OTHER_API_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 300_000 });
const model = 'kvmesh';

const prefix = 'You are a queued assistant; nobody waits on you in real time. '.repeat(3);
const chat = { model, messages: [{ role: 'system', content: prefix }, { role: 'user', content: 'Summarise the queue.' }], max_tokens: 10, temperature: 0 };
const comp = { model, prompt: prefix + 'The queue drains when', max_tokens: 10, temperature: 0 };
const requests = [chat, comp, { ...comp, prompt: prefix + 'A second prompt', max_tokens: 6 }];

// Submit: 202 with an id, whatever the load.
const { data: sub, response: subResp } = await client.post('/queue', { body: { requests } }).withResponse();
assert.equal(subResp.status, 202, 'POST /v1/queue status');
assert.equal(sub.status, 'queued');
assert.match(sub.request_id, /^batch_/);

// Poll until it is no longer queued or running.
async function poll(c, id) {
  const states = new Set();
  for (let i = 0; i < 6000; i++) {
    const r = await c.get(`/queue/${id}`);
    assert.equal(r.request_id, id);
    states.add(r.status);
    if (r.status !== 'queued' && r.status !== 'running') return { r, states };
    await new Promise((ok) => setTimeout(ok, 50));
  }
  throw new Error(`batch ${id} did not finish`);
}
const { r: done, states } = await poll(client, sub.request_id);
assert.equal(done.status, 'completed');
assert.equal(done.responses.length, requests.length);

// Each response is what the same request gets synchronously.
const syncChat = await client.chat.completions.create(chat);
const syncComp = await client.completions.create(comp);
const syncComp2 = await client.completions.create(requests[2]);
const [qChat, qComp, qComp2] = done.responses;
assert.equal(qChat.object, 'chat.completion');
assert.equal(qChat.choices[0].message.content, syncChat.choices[0].message.content, 'queued chat differs from the synchronous one');
assert.equal(qComp.object, 'text_completion');
assert.equal(qComp.choices[0].text, syncComp.choices[0].text, 'queued completion differs from the synchronous one');
assert.equal(qComp2.choices[0].text, syncComp2.choices[0].text);
for (const [q, s] of [[qChat, syncChat], [qComp, syncComp], [qComp2, syncComp2]]) {
  assert.equal(q.usage.prompt_tokens, s.usage.prompt_tokens);
  assert.equal(q.usage.completion_tokens, s.usage.completion_tokens);
  assert.equal(typeof q.usage.prompt_tokens_details.cached_tokens, 'number', 'queued usage without cached_tokens');
}

// The list names it.
const list = await client.get('/queue');
assert.ok(list.data.some((b) => b.request_id === sub.request_id && b.status === 'completed'), 'GET /v1/queue does not list the batch');

// Errors are APIError subclasses with the right status and an OpenAI error object.
async function expectError(call, status, cls, what) {
  try {
    await call();
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `${what}: ${e} is not an APIError`);
    assert.ok(e instanceof cls, `${what}: ${e.constructor.name}, want ${cls.name}`);
    assert.equal(e.status, status, `${what}: status ${e.status}`);
    assert.ok(e.error && typeof e.error.message === 'string' && e.error.message.length > 0, `${what}: no error object`);
    assert.equal(typeof e.error.type, 'string', `${what}: error object without type`);
    return e;
  }
  throw new Error(`${what}: no error`);
}

// Another tenant's id is 404, like an unknown one: no oracle.
if (otherKey) {
  const other = new OpenAI({ baseURL, apiKey: otherKey, maxRetries: 0 });
  const e = await expectError(() => other.get(`/queue/${sub.request_id}`), 404, OpenAI.NotFoundError, "another tenant's id");
  await expectError(() => other.delete(`/queue/${sub.request_id}`), 404, OpenAI.NotFoundError, "another tenant's id, cancelled");
  const unknown = await expectError(() => client.get('/queue/batch_nosuchbatch'), 404, OpenAI.NotFoundError, 'unknown id');
  assert.equal(e.error.code, unknown.error.code, 'a foreign id and an unknown one must answer alike');
  const otherList = await other.get('/queue');
  assert.ok(!otherList.data.some((b) => b.request_id === sub.request_id), "another tenant's list shows the batch");
}
await expectError(() => client.get('/queue/batch_nosuchbatch'), 404, OpenAI.NotFoundError, 'unknown id');
await expectError(() => client.delete('/queue/batch_nosuchbatch'), 404, OpenAI.NotFoundError, 'unknown id, cancelled');
await expectError(() => client.post('/queue', { body: { requests: [] } }), 400, OpenAI.BadRequestError, 'empty requests');
await expectError(() => client.post('/queue', { body: {} }), 400, OpenAI.BadRequestError, 'no requests');
await expectError(() => client.post('/queue', { body: { requests: [{ ...comp, stream: true }] } }), 400, OpenAI.BadRequestError, 'stream in a batch');
await expectError(() => client.post('/queue', { body: { requests: [comp, { model, max_tokens: 3 }] } }), 400, OpenAI.BadRequestError, 'neither prompt nor messages');
await expectError(() => client.post('/queue', { body: { requests: Array(300).fill(comp) } }), 413, OpenAI.APIError, 'too many requests');
await expectError(() => client.post('/queue', { body: { requests: [comp], callback_url: 'http://169.254.169.254/latest' } }), 400, OpenAI.BadRequestError, 'callback host not allowed');
await expectError(() => client.delete(`/queue/${sub.request_id}`), 409, OpenAI.ConflictError, 'cancel a finished batch');
// Malformed JSON: the SDK always encodes its body, so plain fetch sends it.
const bad = await fetch(`${baseURL}/queue`, {
  method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` }, body: '{"requests": [',
});
assert.equal(bad.status, 400, 'malformed JSON');
const badBody = await bad.json();
assert.ok(badBody.error?.message, 'malformed JSON: no OpenAI error object');

// Cancel: a long batch, cancelled at once, ends cancelled with an error
// object in place of each request it did not run.
const long = Array.from({ length: 48 }, (_, i) => ({ ...comp, prompt: `${prefix} cancelled request ${i}`, max_tokens: 48 }));
const sub2 = await client.post('/queue', { body: { requests: long } });
const del = await client.delete(`/queue/${sub2.request_id}`);
assert.ok(del.status === 'cancelled' || del.status === 'running', `DELETE answered ${del.status}`);
const { r: cancelled } = await poll(client, sub2.request_id);
assert.equal(cancelled.status, 'cancelled');
assert.equal(cancelled.responses.length, long.length);
const skipped = cancelled.responses.filter((r) => r.error?.code === 'cancelled').length;
assert.ok(skipped > 0, 'a cancelled batch with no cancelled request');

// The node keeps serving.
const after = await client.completions.create(comp);
assert.equal(after.choices[0].text, syncComp.choices[0].text);

console.log(JSON.stringify({
  ok: true,
  request_id: sub.request_id,
  states_seen: [...states],
  cancelled_requests: skipped,
  queued_cached_tokens: qComp2.usage.prompt_tokens_details.cached_tokens,
}));
