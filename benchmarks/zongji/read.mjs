// Peer reader for the canal-ha benchmark: reads the binlog from a position with
// @vlasky/zongji, touches every value of every row, and stops after `rows` row changes.
// Usage: node read.mjs '{"host":..,"port":..,"user":..,"password":..,"filename":..,
//                        "position":..,"serverId":..,"rows":..,"timeoutS":..}'
// Prints one JSON line: {"rows": N, "seconds": S} (S from start() to the last row).

import ZongJi from '@vlasky/zongji';

const opts = JSON.parse(process.argv[2]);
const zongji = new ZongJi({
  host: opts.host,
  port: opts.port,
  user: opts.user,
  password: opts.password,
});

let rows = 0;
let touched = 0;
let t0 = 0n;
let done = false;

function touch(obj) {
  for (const key in obj) {
    if (obj[key] !== undefined) touched++;
  }
}

function finish(code, extra) {
  if (done) return;
  done = true;
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  process.stdout.write(JSON.stringify({ rows, seconds, touched, ...extra }) + '\n');
  process.exitCode = code;
  zongji.stop();
  setTimeout(() => process.exit(code), 200).unref();
}

zongji.on('binlog', (evt) => {
  if (!Array.isArray(evt.rows)) return; // tablemap
  const name = evt.getEventName();
  if (name === 'updaterows') {
    for (const row of evt.rows) { touch(row.before); touch(row.after); }
  } else {
    for (const row of evt.rows) touch(row);
  }
  rows += evt.rows.length;
  if (rows >= opts.rows) finish(0, {});
});

zongji.on('error', (err) => finish(1, { error: String(err && err.message || err) }));

setTimeout(() => finish(1, { error: `timeout after ${opts.timeoutS}s` }), opts.timeoutS * 1000).unref();

t0 = process.hrtime.bigint();
zongji.start({
  serverId: opts.serverId,
  filename: opts.filename,
  position: opts.position,
  includeEvents: ['tablemap', 'writerows', 'updaterows', 'deleterows'],
});
