#!/usr/bin/env node
// Uploads a file to a Sluice (or Backend.AI) tus endpoint with tus-js-client, the client the
// Backend.AI web UI uses. The upload URL is `/upload?token=...` as the manager hands it out, so
// tus-js-client starts with HEAD (resume) and continues with PATCH from the server's offset.
//
//   node upload.js --url URL --file PATH [--stop-after N] [--chunk-size N] [--retries N]
//
// --stop-after N   abort the upload once N bytes have been sent (an interrupted upload); the
//                  file's bytes past N are held back, so the server never sees them (the
//                  client's progress events are throttled to one per 100 ms, and over loopback
//                  the rest of the file could otherwise go out before the abort)
// --chunk-size N   bytes per PATCH (default: the whole rest of the file in one PATCH)
// --retries N      let tus-js-client retry failed requests N times (default 0)
//
// Prints one JSON line: {"status": "complete"|"stopped"|"error", "offset": N, "sent": N,
// "resumedFrom": N|null, "error"?: "...", "httpStatus"?: N} and exits 0 for complete/stopped,
// 1 for error. `sent` is the absolute offset reached; `resumedFrom` is the offset the first
// PATCH started at (what HEAD reported).
'use strict'

const fs = require('fs')
const { Transform } = require('stream')
const tus = require('tus-js-client')

// Makes the streams tus-js-client opens on `file` (one per PATCH, from its offset) stop
// delivering at absolute offset `stopAt`: they stall there, and `onStall` is called once.
function holdBackFrom(file, stopAt, onStall) {
  let stalled = false
  const open = fs.createReadStream
  fs.createReadStream = function (path, opts) {
    const src = open.call(fs, path, opts)
    if (path !== file) return src
    let pos = (opts && opts.start) || 0
    const gate = new Transform({
      transform(chunk, _enc, done) {
        const room = stopAt - pos
        if (room <= 0) {
          // Never completes: the PATCH hangs here until aborted.
          if (!stalled) {
            stalled = true
            onStall()
          }
          return
        }
        const part = room < chunk.length ? chunk.subarray(0, room) : chunk
        pos += part.length
        done(null, part)
      },
    })
    return src.pipe(gate)
  }
}

function parseArgs(argv) {
  const out = { stopAfter: null, chunkSize: Infinity, retries: 0 }
  for (let i = 2; i < argv.length; i += 2) {
    const k = argv[i]
    const v = argv[i + 1]
    if (v === undefined) throw new Error(`missing value for ${k}`)
    if (k === '--url') out.url = v
    else if (k === '--file') out.file = v
    else if (k === '--stop-after') out.stopAfter = Number(v)
    else if (k === '--chunk-size') out.chunkSize = Number(v)
    else if (k === '--retries') out.retries = Number(v)
    else throw new Error(`unknown option ${k}`)
  }
  if (!out.url || !out.file) throw new Error('--url and --file are required')
  return out
}

function report(obj, code) {
  process.stdout.write(JSON.stringify(obj) + '\n', () => process.exit(code))
}

function main() {
  let args
  try {
    args = parseArgs(process.argv)
  } catch (e) {
    report({ status: 'error', error: e.message }, 2)
    return
  }
  const size = fs.statSync(args.file).size
  let sent = 0
  let resumedFrom = null
  const upload = new tus.Upload(fs.createReadStream(args.file), {
    uploadUrl: args.url,
    uploadSize: size,
    chunkSize: args.chunkSize,
    retryDelays: args.retries > 0 ? Array(args.retries).fill(200) : null,
    storeFingerprintForResuming: false,
    onProgress(bytesSent) {
      // tus-js-client reports the absolute offset, first the one it starts a PATCH from.
      if (resumedFrom === null) resumedFrom = bytesSent
      sent = bytesSent
    },
    onSuccess() {
      report({ status: 'complete', offset: size, sent, resumedFrom }, 0)
    },
    onError(err) {
      const res = err.originalResponse
      report(
        {
          status: 'error',
          error: String(err.message || err),
          httpStatus: res ? res.getStatus() : null,
          offset: upload._offset,
          sent,
          resumedFrom,
        },
        1,
      )
    },
  })
  if (args.stopAfter !== null) {
    holdBackFrom(args.file, args.stopAfter, () => {
      // What was handed to the socket drains first; then abort() cuts the running PATCH and
      // the server keeps what it received.
      setTimeout(() => {
        upload
          .abort()
          .then(() =>
            report({ status: 'stopped', offset: upload._offset, sent, resumedFrom }, 0),
          )
      }, 300)
    })
  }
  upload.start()
}

main()
