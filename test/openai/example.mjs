// The README's example: the official openai package against a kvmesh node
// (or kvmesh route). Run: (cd test/openai && npm ci) && node test/openai/example.mjs
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.KVMESH_BASE_URL ?? 'http://127.0.0.1:7601/v1',
  apiKey: process.env.KVMESH_API_KEY ?? 'unused', // a token of --auth-token-file, if the node asks for one
});
const messages = [
  { role: 'system', content: 'You are a terse assistant. '.repeat(12) },
  { role: 'user', content: 'Say hello.' },
];
for (const turn of [1, 2]) {
  const r = await client.chat.completions.create(
    { model: 'kvmesh', messages, max_tokens: 16, temperature: 0 },
    { headers: { 'x-session-affinity': 'demo-session' } }, // a hint: logged and echoed, never needed for a hit
  );
  console.log(`turn ${turn}: ${r.usage.prompt_tokens} prompt tokens, ${r.usage.prompt_tokens_details.cached_tokens} cached,`,
    JSON.stringify(r.choices[0].message.content));
}
const stream = await client.completions.create({ model: 'kvmesh', prompt: 'Once upon a time', max_tokens: 16, stream: true });
for await (const chunk of stream) process.stdout.write(JSON.stringify(chunk.choices[0]?.text ?? '') + ' ');
console.log();
