// serve_openai.js: the official `openai` npm package against `sluice serve`
// (run by test_serve_openai.sh). Env: OPENAI_PREFIX (where npm installed
// it), SERVE_URL (http://127.0.0.1:PORT/v1), API_KEY, and WANT_COMPLETION /
// WANT_CHAT: `sluice run`'s greedy continuations of the prompts below.
// Exits 0 when every check passes, 1 otherwise (each failure printed).
'use strict';
const { createRequire } = require('module');
const req = createRequire(process.env.OPENAI_PREFIX + '/node_modules/');
const mod = req('openai');
const OpenAI = mod.OpenAI || mod.default || mod;

let failures = 0;
function check(ok, what) {
  if (!ok) {
    console.error('FAIL: ' + what);
    failures++;
  }
}

async function main() {
  const client = new OpenAI({ baseURL: process.env.SERVE_URL, apiKey: process.env.API_KEY,
                              maxRetries: 0, timeout: 60000 });
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === 'm', 'models.list: ' +
        JSON.stringify(models.data));

  const messages = [{ role: 'user', content: 'Tell me of the land of Egypt' }];
  // chat, not streaming
  const c = await client.chat.completions.create({ model: 'm', messages, max_tokens: 24,
                                                   temperature: 0 });
  check(c.object === 'chat.completion', 'chat object ' + c.object);
  check(c.choices[0].message.role === 'assistant', 'chat role');
  check(c.choices[0].message.content === process.env.WANT_CHAT,
        'chat text ' + JSON.stringify(c.choices[0].message.content) + ' want ' +
        JSON.stringify(process.env.WANT_CHAT));
  check(c.usage && c.usage.prompt_tokens > 0 && c.usage.completion_tokens > 0 &&
        c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens,
        'chat usage ' + JSON.stringify(c.usage));
  check(['stop', 'length'].includes(c.choices[0].finish_reason), 'chat finish_reason');

  // chat, streaming
  const stream = await client.chat.completions.create({ model: 'm', messages, max_tokens: 24,
                                                        temperature: 0, stream: true,
                                                        stream_options: { include_usage: true } });
  let text = '', chunks = 0, finish = null, usage = null;
  for await (const ch of stream) {
    chunks++;
    if (ch.usage) usage = ch.usage;
    if (!ch.choices.length) continue;
    if (ch.choices[0].delta.content) text += ch.choices[0].delta.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  check(text === process.env.WANT_CHAT, 'chat stream text ' + JSON.stringify(text));
  check(chunks >= 3 && finish !== null, `chat stream: ${chunks} chunks, finish ${finish}`);
  check(usage && usage.completion_tokens > 0, 'chat stream usage ' + JSON.stringify(usage));

  // completions, both ways
  const p = await client.completions.create({ model: 'm', prompt: 'And God said', max_tokens: 24,
                                              temperature: 0 });
  check(p.choices[0].text === process.env.WANT_COMPLETION,
        'completion text ' + JSON.stringify(p.choices[0].text));
  const ps = await client.completions.create({ model: 'm', prompt: 'And God said',
                                               max_tokens: 24, temperature: 0, stream: true });
  let pt = '';
  for await (const ch of ps) pt += ch.choices.length ? ch.choices[0].text : '';
  check(pt === process.env.WANT_COMPLETION, 'completion stream text ' + JSON.stringify(pt));

  // errors arrive as the client's typed errors
  for (const [args, status] of [[{ model: 'gpt-4', messages }, 404],
                                [{ model: 'm', messages, temperature: -1 }, 400],
                                [{ model: 'm', messages: [] }, 400]]) {
    try {
      await client.chat.completions.create(args);
      check(false, 'accepted ' + JSON.stringify(args));
    } catch (e) {
      check(e instanceof OpenAI.APIError && e.status === status && e.error && e.error.message,
            `error for ${JSON.stringify(args)}: ${e.status} ${e.message}`);
    }
  }
  const bad = new OpenAI({ baseURL: process.env.SERVE_URL, apiKey: 'wrong', maxRetries: 0 });
  try {
    await bad.models.list();
    check(false, 'a wrong key was accepted');
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, 'wrong key: ' + e.status);
  }
}

main().then(() => {
  if (failures) {
    console.error(failures + ' failures');
    process.exit(1);
  }
  console.log('openai client: all checks passed');
}, (e) => {
  console.error('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
