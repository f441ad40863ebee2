-- slotkit shared throttling: every operation of the Redis backend in one script.
--
-- The same semantics live in slotkit/shared/twin.py (the pure-Python twin used
-- in local mode and in unit tests); tests/test_shared_script.py runs random
-- operation sequences through both and compares the replies byte for byte.
--
-- KEYS[1] is the workers sorted set; then two keys per scope: its state hash
-- and its lease sorted set. All keys share one hash tag, so the script is
-- Redis Cluster safe. Times are Redis's own TIME (ARGV[2] may pin "now", for
-- the parity tests only); every reply is a relative wait, so the clocks of
-- the workers never matter.
--
-- ARGV: op, now override ('' = TIME), worker id, worker ttl ('' = no heartbeat
-- on this call, see 1. below), then the leases
-- to give back (every op carries them, so a release rides on the next call):
--   n releases, then 3 per release: lease id, index in KEYS of its lease set (its
--   state hash is the key just before it), concurrency
-- then per op (the releases are done first):
--   acquire: lease id, lease ttl, horizon, key ttl, n scopes, then 17 per scope:
--            amount, delay, concurrency, quota (<= 0: none), window, crawl delay,
--            backoff factor, backoff min, backoff max, backoff window, jitter factor,
--            rampup (1/0), rampup target (low end), rampup delay factor,
--            rampup min delay, rampup window, min concurrency
--   release: (the releases, and optionally) n scopes to hand a free slot on,
--            then the KEYS index of each one's state hash
--   backoff: key ttl, n scopes, then 16 per scope:
--            hold seconds (< 0: a step instead), age of the request, delay,
--            crawl delay, backoff factor, backoff min, backoff max, backoff window,
--            then the six rampup ones as in acquire, concurrency, and the
--            rampup target's high end
--   quota:   key ttl, n scopes, then 4 per scope: consumed, remaining (< 0: unknown), quota, window
--   adopt:   lease ttl, key ttl, n scopes, then per scope: gap (seconds), quota units
--            spent, quota window, m leases, then the m lease ids -- what a fallback
--            has in flight, its pace and the quota it spent
--   beat:    (nothing) -- heartbeat; replies with the live worker count; or, from a
--            worker back from its fallback, a grace (seconds) and KEYS[2] the resync
--            hash: the reply adds the wait until every worker goes back to the store
--   leave:   (nothing)
-- Every reply starts with a status word and "count:rank": the live worker
-- count and how many live worker ids sort before this one ('' on a call
-- without the heartbeat).

-- The library functions the script uses, as locals: each use of a global
-- looks it up through the server's protected globals table.
local call, tonumber, tostring, unpack = redis.call, tonumber, tostring, unpack
local byte, format, gmatch, sub = string.byte, string.format, string.gmatch, string.sub
local ceil, floor, max, min, huge = math.ceil, math.floor, math.max, math.min, math.huge
local concat = table.concat

local op = ARGV[1]
local now
if ARGV[2] ~= '' then
  now = tonumber(ARGV[2])
else
  local t = call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local wid = ARGV[3]
local wttl = tonumber(ARGV[4])
local workers = KEYS[1]
local prefix = sub(workers, 1, -2)
local channel = prefix .. 'ev'
local nrel = tonumber(ARGV[5])
-- Where the op's own arguments start.
local o = 5 + 3 * nrel

-- The scope id in a state or lease key: after the prefix and 's:' or 'l:'.
local function scope_of(key)
  return sub(key, #prefix + 3)
end

local function fmt(x)
  return format('%.6f', x)
end

local function pexpire(key, seconds)
  local v = ceil(seconds * 1000)
  if v < 1 then v = 1 end
  call('PEXPIRE', key, v)
end

-- Sorted sets score in whole milliseconds (a worker's or a lease's end): a
-- small sorted set compares integer scores as they are, where a decimal one
-- is parsed again at every step of an insert or a range.
local function ms_after(t)
  return format('%d', ceil(t * 1000))
end
local now_msn = floor(now * 1000)
local now_ms = format('%d', now_msn)

local function num(v, default)
  local n = tonumber(v)
  if n == nil then return default end
  return n
end

-- 1. Heartbeat: a call carrying the worker ttl proves this worker alive and
-- counts the others. A worker sends it at least every half heartbeat period,
-- not on every call: with eight workers it was half of an acquire's time.
-- Ended workers stay in the set until a heartbeat clears them; alive() is
-- what every other use asks.
local N = ''
if wttl then
  call('ZREMRANGEBYSCORE', workers, '-inf', now_ms)
  if op == 'leave' then
    call('ZREM', workers, wid)
  else
    call('ZADD', workers, ms_after(now + wttl), wid)
  end
  pexpire(workers, wttl * 2)
  local ids = call('ZRANGE', workers, 0, -1)
  local n = #ids
  if n < 1 then n = 1 end
  -- This worker's place among the live ones: while the store is down, a scope
  -- with fewer slots than workers is left to the first ones. Any order all
  -- workers agree on will do; ids are compared byte by byte from their ends
  -- (Lua's own '<' follows the server's locale). Worker ids end in a random
  -- part, so the last bytes nearly always decide: from the front, the host
  -- name they share cost a call per character, the script's largest cost
  -- with eight workers. (Numeric loops: ipairs costs a C call per step.)
  local mine, lm = {byte(wid, 1, -1)}, #wid
  local rank = 0
  for j = 1, #ids do
    local id = ids[j]
    local li = #id
    local less = li < lm
    local common = lm
    if less then common = li end
    for k = 0, common - 1 do
      local x, y = byte(id, li - k), mine[lm - k]
      if x ~= y then
        less = x < y
        break
      end
    end
    if less then rank = rank + 1 end
  end
  N = tostring(n) .. ':' .. tostring(rank)
end

-- A worker is alive while its end is ahead.
local function alive(id)
  local score = call('ZSCORE', workers, id)
  return score ~= false and tonumber(score) > now_msn
end

-- Workers told a scope was full queue for it, in order, in the 'wq' field of
-- its state hash (ids joined by spaces). A freed slot wakes the first live
-- one only: waking every waiting worker would have them all ask again for
-- one slot, a call per worker per request.
local function enqueue(skey, id, ttl)
  local queue = call('HGET', skey, 'wq')
  if not queue then
    call('HSET', skey, 'wq', id)
    -- (A scope full of leases adopted after an outage may have no state yet.)
    if call('PTTL', skey) < 0 then pexpire(skey, ttl) end
    return
  end
  for other in gmatch(queue, '%S+') do
    if other == id then return end
  end
  call('HSET', skey, 'wq', queue .. ' ' .. id)
end

-- A field of the state hash holding a list, words joined by spaces (none:
-- the field goes, and the hash with it if it was the last one).
local function write_list(skey, field, words)
  if #words == 0 then
    call('HDEL', skey, field)
  else
    call('HSET', skey, field, concat(words, ' '))
  end
end

local function leave_queue(skey, id)
  local queue = call('HGET', skey, 'wq')
  if not queue then return end
  local rest = {}
  for other in gmatch(queue, '%S+') do
    if other ~= id then rest[#rest + 1] = other end
  end
  write_list(skey, 'wq', rest)
end

-- The first waiter still alive other than *skip*, taken off the queue (dead
-- ones before it too; *skip* keeps its place).
local function first_waiter(skey, skip)
  local queue = call('HGET', skey, 'wq')
  if not queue then return nil end
  local who, rest = nil, {}
  for other in gmatch(queue, '%S+') do
    if who or other == skip then
      rest[#rest + 1] = other
    elseif alive(other) then
      who = other
    end
  end
  write_list(skey, 'wq', rest)
  return who
end

-- A worker named for a freed slot holds a claim on it for CLAIM seconds (the
-- 'nm' field: id and end, space separated): a request asking meanwhile (often
-- the releasing worker's next one, a round trip ahead of the named worker's
-- ask) finds the slot taken instead of taking it, so the queue's order holds.
local CLAIM = 0.5

-- The claims still in force, as {id, end, id, end, ...}; whether any lapsed.
local function read_claims(skey)
  local raw = call('HGET', skey, 'nm')
  local list, lapsed = {}, false
  if raw then
    local id = nil
    for word in gmatch(raw, '%S+') do
      if not id then
        id = word
      else
        if tonumber(word) > now and alive(id) then
          list[#list + 1] = id
          list[#list + 1] = word
        else
          lapsed = true
        end
        id = nil
      end
    end
  end
  return list, lapsed
end

-- How many of the claims *list* are other workers' than *id*.
local function others(list, id)
  local count = 0
  for j = 1, #list, 2 do
    if list[j] ~= id then count = count + 1 end
  end
  return count
end

-- *id* asked: its claims (and lapsed ones) are gone. *list* and *changed*:
-- read_claims's answer, if the caller has it already.
local function drop_claims(skey, id, list, changed)
  if not list then list, changed = read_claims(skey) end
  local kept = {}
  for j = 1, #list, 2 do
    if list[j] == id then
      changed = true
    else
      kept[#kept + 1] = list[j]
      kept[#kept + 1] = list[j + 1]
    end
  end
  if changed then write_list(skey, 'nm', kept) end
end

-- Wake *who* for a free slot of the scope, and claim the slot for it.
local function name(skey, who)
  local list = read_claims(skey)
  list[#list + 1] = who
  list[#list + 1] = fmt(now + CLAIM)
  write_list(skey, 'nm', list)
  -- (The queue's last entry gone, the hash may have been made anew here.)
  if call('PTTL', skey) < 0 then pexpire(skey, CLAIM + 1) end
  call('PUBLISH', channel, 'free\t' .. scope_of(skey) .. '\t' .. who)
end

-- 2. Leases given back (piggy-backed on this call). A release is published to
-- the worker that waited longest for its scope, which asks again at once; to
-- every worker if nobody is queued but the scope was full.
for r = 1, nrel do
  local b = 5 + 3 * (r - 1)
  local index = tonumber(ARGV[b + 2])
  local lkey = KEYS[index]
  local active = call('ZCARD', lkey)
  local removed = call('ZREM', lkey, ARGV[b + 1])
  if removed > 0 then
    local skey = KEYS[index - 1]
    local message = 'free\t' .. sub(lkey, #prefix + 3)
    local who = first_waiter(skey, nil)
    if who then
      name(skey, who)
    else
      -- Nobody queued: tell everyone if the scope was full (rampup may hold
      -- it below the configured concurrency the release carries).
      local limit = tonumber(ARGV[b + 3])
      local rc = num(call('HGET', skey, 'rc'), 0)
      if rc >= 1 and rc < limit then limit = rc end
      if active >= limit then call('PUBLISH', channel, message) end
    end
  end
end

-- A beat from a worker back from its fallback (a grace in ARGV, the resync
-- hash in KEYS[2]) asks when every worker goes back to the store: the first
-- one to ask sets that moment a grace period ahead, so that every worker
-- tells the store what its fallback has in flight at about the same time.
-- The reply also names the moment itself (as stored): a worker told a
-- different one than before knows the store that set the first is gone.
if op == 'beat' and ARGV[o + 1] then
  local grace = tonumber(ARGV[o + 1])
  local stored = call('HGET', KEYS[2], 'at')
  if not stored then
    stored = fmt(now + grace)
    call('HSET', KEYS[2], 'at', stored)
    -- Kept a while past the moment: a worker finding the store back late
    -- switches at once instead of starting a new grace beside shared ones.
    pexpire(KEYS[2], 3 * grace)
  end
  return {'ok', N, fmt(tonumber(stored) - now), stored}
end

-- A release may also name scopes (by the KEYS index of their state hash)
-- whose free slot this worker was woken for but no longer waits for (its
-- request went another way): the next worker queued for each is woken.
if op == 'release' and ARGV[o + 1] then
  for j = 1, tonumber(ARGV[o + 1]) do
    local skey = KEYS[tonumber(ARGV[o + 1 + j])]
    drop_claims(skey, wid)
    local who = first_waiter(skey, wid)
    if who then name(skey, who) end
  end
end

if op == 'beat' or op == 'leave' or op == 'release' then
  return {'ok', N}
end

-- rd/rc: the rampup delay and concurrency (rc == 0: rampup not started);
-- rwe: end of the rampup window; rt/rs: triggers and dispatches in it.
local FIELDS = {'tat', 'hold', 'bo', 'rec', 'ss', 'cd', 'qw', 'qu', 'rd', 'rc', 'rwe', 'rt', 'rs'}

-- A state as loaded keeps what was read (in 'was'): a save writes only the
-- fields that changed, which for most acquires is the next slot alone (every
-- field formatted and written was a third of the script's time).
local function load(key)
  local raw = call('HMGET', key, unpack(FIELDS))
  local st, was = {}, {}
  for i = 1, #FIELDS do
    local v = 0
    if raw[i] then v = num(raw[i], 0) end
    st[FIELDS[i]] = v
    was[FIELDS[i]] = v
  end
  st.was = was
  return st
end

local function save(key, st, ttl)
  local flat, was = {}, st.was
  for i = 1, #FIELDS do
    local name = FIELDS[i]
    if st[name] ~= was[name] then
      flat[#flat + 1] = name
      flat[#flat + 1] = fmt(st[name])
    end
  end
  if #flat > 0 then call('HSET', key, unpack(flat)) end
  local keep = ttl
  local horizon = max(st.tat, st.hold, st.rec) - now
  if horizon + ttl > keep then keep = horizon + ttl end
  pexpire(key, keep)
end

-- When the gap after the last slot already taken ends: slots are one
-- interval apart, so the latest one at or before now is tat less whole
-- intervals. (tat itself also counts reservations still to come, which a
-- hold gives back.)
local function gap_end(st, base)
  local interval = max(base, st.bo)
  if st.tat <= now or interval <= 0 then return st.tat end
  -- (Less a microsecond: tat - now can come out a hair above a whole interval.)
  return st.tat - (ceil((st.tat - now - 0.000001) / interval) - 1) * interval
end

-- Backoff recovery, computed when asked (no timer): one factor step down per
-- quiet window; a step below the first backoff step or the base delay ends it.
-- rec == 0 means "never recovers" (backoff window 0).
local function settle(st, base, factor, floor, window)
  local before = max(base, st.bo)
  while st.bo > 0 and st.rec > 0 and now >= st.rec do
    local lower = st.bo / factor
    if lower < floor or lower <= base then
      st.bo = 0
      st.rec = 0
    else
      st.bo = lower
      st.rec = st.rec + window
    end
  end
  -- The next slot comes back in by what the interval shrank: it was set a
  -- backed-off interval after the last reserved one.
  st.tat = st.tat - (before - max(base, st.bo))
end

-- Shared rampup: at the end of each window with fewer triggers than the
-- target's low end (and no backoff), one step up for every worker at once:
-- the delay by its factor down to its minimum, then the concurrency by one.
local function ramp(st, a)
  if st.rc < 1 then
    -- Never faster than its min_delay, as in one process.
    st.rd = max(a.delay, a.rmin)
    st.rc = a.minc
  end
  while st.rwe > 0 and now >= st.rwe do
    if st.rt < a.rlow and st.rs > 0 and st.bo == 0 then
      if st.rd > a.rmin then
        -- Within 10 ms of the minimum counts as there (halving never reaches 0).
        local lowered = st.rd * a.rfac
        if lowered < a.rmin + 0.01 then lowered = a.rmin end
        st.rd = lowered
      elseif st.rc < a.conc then
        st.rc = st.rc + 1
      end
    end
    st.rt = 0
    st.rs = 0
    st.rwe = st.rwe + a.rwin
    if now >= st.rwe then
      st.rwe = st.rwe + (floor((now - st.rwe) / a.rwin) + 1) * a.rwin
    end
  end
  -- A ceiling lowered since (robots.txt's 1, a slot's concurrency) holds at
  -- once, as in one process.
  if st.rc > a.conc then st.rc = max(a.minc, a.conc) end
  a.delay = st.rd
  a.conc = st.rc
end

-- One backoff step for a trigger beyond what rampup pays for: rampup's
-- concurrency goes back first, then the backoff delay grows.
local function step(st, a, base, factor, bmin, bmax, skey)
  if a.ron > 0 and st.rc > a.minc then
    st.rc = st.rc - 1
    return
  end
  local before = max(base, st.bo)
  st.bo = min(bmax, max(bmin, before * factor))
  local after = max(base, st.bo)
  if after > before then
    -- The workers give back the reservations they wait on (the "step"
    -- message) and ask again: the next slot is the new interval after
    -- the trigger, as in one process (after a timeout longer than the
    -- interval, counted from the last reservation it left no rest).
    st.tat = now + after
    call('PUBLISH', channel, 'step\t' .. scope_of(skey))
  end
end

-- What one worker's fallback did while the store was down, told after it
-- came back: its requests still in flight hold leases, and the next request
-- waits for the gap left after its last one.
if op == 'adopt' then
  local lease_ttl = tonumber(ARGV[o + 1])
  local key_ttl = tonumber(ARGV[o + 2])
  local scopes = tonumber(ARGV[o + 3])
  local b = o + 3
  for i = 1, scopes do
    local gap = tonumber(ARGV[b + 1])
    local units = tonumber(ARGV[b + 2])
    local window = tonumber(ARGV[b + 3])
    local m = tonumber(ARGV[b + 4])
    local skey, lkey = KEYS[2 * i], KEYS[2 * i + 1]
    local st = load(skey)
    if now + gap > st.tat then st.tat = now + gap end
    -- Quota units the fallback spent count in the current window (unless
    -- reservations already count a later one).
    if units > 0 and window > 0 then
      local widx = floor(now / window)
      if widx > st.qw then
        st.qw = widx
        st.qu = 0
      end
      if widx == st.qw then st.qu = st.qu + units end
    end
    save(skey, st, key_ttl)
    for j = 1, m do
      call('ZADD', lkey, ms_after(now + lease_ttl), ARGV[b + 4 + j])
    end
    -- Never shorten the set's life: an acquire may have reserved further ahead.
    if m > 0 and call('PTTL', lkey) < ceil((lease_ttl + 1) * 1000) then
      pexpire(lkey, lease_ttl + 1)
    end
    b = b + 4 + m
  end
  return {'ok', N}
end

if op == 'acquire' then
  local lease = ARGV[o + 1]
  local lease_ttl = tonumber(ARGV[o + 2])
  local horizon = tonumber(ARGV[o + 3])
  local key_ttl = tonumber(ARGV[o + 4])
  local scopes = tonumber(ARGV[o + 5])
  local states, args, holds = {}, {}, {}
  local ready = now
  local full, full_retry = false, huge
  local quota_wait = 0
  for i = 1, scopes do
    local b = o + 5 + (i - 1) * 17
    local a = {
      amount = tonumber(ARGV[b + 1]), delay = tonumber(ARGV[b + 2]),
      conc = tonumber(ARGV[b + 3]), quota = tonumber(ARGV[b + 4]),
      window = tonumber(ARGV[b + 5]), cd = tonumber(ARGV[b + 6]),
      jf = tonumber(ARGV[b + 11]), ron = tonumber(ARGV[b + 12]),
    }
    local skey, lkey = KEYS[2 * i], KEYS[2 * i + 1]
    local st = load(skey)
    -- The rampup and backoff curve arguments are read only when in use
    -- (parsing numbers is a good part of an acquire's work).
    if a.ron > 0 then
      a.rlow, a.rfac = tonumber(ARGV[b + 13]), tonumber(ARGV[b + 14])
      a.rmin, a.rwin = tonumber(ARGV[b + 15]), tonumber(ARGV[b + 16])
      a.minc = tonumber(ARGV[b + 17])
      ramp(st, a)
    end
    -- The larger of the stored and this worker's robots.txt Crawl-delay wins.
    if a.cd > st.cd then st.cd = a.cd end
    a.base = max(a.delay * a.jf, st.cd)
    -- (Without a backoff in force, settling changes nothing.)
    if st.bo > 0 then
      settle(st, a.base, tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8]), tonumber(ARGV[b + 10]))
    end
    a.interval = max(a.base, st.bo)
    call('ZREMRANGEBYSCORE', lkey, '-inf', now_ms)
    local held = call('ZCARD', lkey)
    -- Slots claimed for other workers woken for them count as taken.
    a.claims, a.lapsed = read_claims(skey)
    local claims = others(a.claims, wid)
    local active = held + claims
    a.active = active
    if active >= a.conc then
      full = true
      local retry = CLAIM
      if held > 0 then
        local first = call('ZRANGE', lkey, 0, 0, 'WITHSCORES')
        retry = tonumber(first[2]) / 1000 - now
        if claims > 0 and CLAIM < retry then retry = CLAIM end
      end
      if retry < full_retry then full_retry = retry end
      -- Workers keeping a finished lease for a moment give it back now.
      call('PUBLISH', channel, 'need\t' .. scope_of(lkey))
    end
    local r = max(st.tat, st.hold)
    if r > ready then ready = r end
    states[i], args[i] = st, a
  end
  -- A quota counts in the window the request goes in (its reserved time, not
  -- the time of this call): a reservation made late in one window for the
  -- next counts in the next, where the server sees it. One window is kept
  -- per scope, the latest any reservation reached.
  for i = 1, scopes do
    local st, a = states[i], args[i]
    if a.quota > 0 then
      local widx = floor(ready / a.window)
      if widx > st.qw then
        st.qw = widx
        st.qu = 0
      end
      if st.qu > 0 and st.qu + a.amount - a.quota > 1e-9 then
        local qw = (st.qw + 1) * a.window - now
        if qw > quota_wait then quota_wait = qw end
      end
    end
  end
  -- A slot beyond the moment a scope's backoff steps down is not reserved:
  -- asked for again then, it comes at the lower interval (reservations made
  -- at the backed-off pace would otherwise keep it for seconds longer).
  local recovery_wait = 0
  for i = 1, scopes do
    local st = states[i]
    if st.bo > 0 and st.rec - now > 0.000001 and ready > st.rec then
      if st.rec - now > recovery_wait then recovery_wait = st.rec - now end
    end
  end
  local wait = ready - now
  local status = 'ok'
  if full then
    status = 'full'
    wait = max(wait, full_retry)
  elseif quota_wait > 0 then
    status = 'wait'
    wait = max(wait, quota_wait)
  elseif recovery_wait > 0 then
    status = 'wait'
    wait = recovery_wait
  elseif wait > horizon then
    status = 'wait'
  end
  local taken = 0
  if status == 'ok' then
    taken = 1
    for i = 1, scopes do
      local st, a = states[i], args[i]
      st.tat = ready + a.interval
      if a.quota > 0 then st.qu = st.qu + a.amount end
      if a.ron > 0 then
        if st.rwe <= 0 then st.rwe = now + a.rwin end
        st.rs = st.rs + 1
      end
      local lkey = KEYS[2 * i + 1]
      call('ZADD', lkey, ms_after(ready + lease_ttl), lease)
      pexpire(lkey, ready + lease_ttl - now + 1)
      save(KEYS[2 * i], st, max(key_ttl, a.window))
    end
  end
  -- A worker told "full" queues for every scope that is full; one admitted,
  -- or told to wait (it then listens for holds only), leaves the queues it
  -- was in. One not admitted passes a scope's free slot on to the next
  -- waiter: woken for the slot, it could not use it.
  for i = 1, scopes do
    local skey = KEYS[2 * i]
    drop_claims(skey, wid, args[i].claims, args[i].lapsed)
    if status ~= 'full' then leave_queue(skey, wid) end
    if args[i].active >= args[i].conc then
      if status == 'full' then enqueue(skey, wid, key_ttl) end
    elseif status ~= 'ok' then
      local who = first_waiter(skey, wid)
      if who then name(skey, who) end
    end
  end
  -- Per scope: the hold left, and the slots still free after this call.
  local reply = {status, N, fmt(wait)}
  for i = 1, scopes do
    reply[#reply + 1] = fmt(max(0, states[i].hold - now))
    reply[#reply + 1] = tostring(args[i].conc - args[i].active - taken)
  end
  return reply
end

if op == 'backoff' then
  local key_ttl = tonumber(ARGV[o + 1])
  local scopes = tonumber(ARGV[o + 2])
  local reply = {'ok', N}
  for i = 1, scopes do
    local b = o + 2 + (i - 1) * 16
    local hold = tonumber(ARGV[b + 1])
    local age = tonumber(ARGV[b + 2])
    local delay, cd = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    local factor, bmin = tonumber(ARGV[b + 5]), tonumber(ARGV[b + 6])
    local bmax, bwin = tonumber(ARGV[b + 7]), tonumber(ARGV[b + 8])
    local a = {
      delay = delay, ron = tonumber(ARGV[b + 9]), rlow = tonumber(ARGV[b + 10]),
      rfac = tonumber(ARGV[b + 11]), rmin = tonumber(ARGV[b + 12]),
      rwin = tonumber(ARGV[b + 13]), minc = tonumber(ARGV[b + 14]),
      conc = tonumber(ARGV[b + 15]), rhigh = tonumber(ARGV[b + 16]),
    }
    local skey = KEYS[2 * i]
    local st = load(skey)
    -- Close the rampup windows that ended first, so the trigger counts in its own.
    if a.ron > 0 then
      ramp(st, a)
      delay = a.delay
    end
    if cd > st.cd then st.cd = cd end
    local base = max(delay, st.cd)
    settle(st, base, factor, bmin, bwin)
    local outcome = 'held'
    if hold >= 0 then
      -- By an earlier hint, or sent before the current step or hold: the same burst.
      local burst = st.hold > now or now - age < st.ss
      if now + hold > st.hold then st.hold = now + hold end
      -- The workers give back the reservations they wait on (the "hold"
      -- message): the next slot is the hold's end, not after theirs.
      -- But not before the backoff gap after the last slot taken ends: a
      -- short hint must not cut a longer backoff short (it does not in one
      -- process; a review saw an 8 s gap end after 0.6 s).
      local cap = st.hold
      if st.bo > 0 then cap = max(cap, gap_end(st, base)) end
      if st.tat > cap then st.tat = cap end
      st.ss = now
      -- With the seconds it has left, so workers that fall back keep it.
      call('PUBLISH', channel, 'hold\t' .. scope_of(skey) .. '\t' .. fmt(st.hold - now))
      -- Beyond rampup's target a hint steps the rate back too, once per hold,
      -- as in one process: a hold alone lets the same rate run into the limit
      -- again right after it.
      if not burst and a.ron > 0 and st.rt + 1 > a.rhigh then
        step(st, a, base, factor, bmin, bmax, skey)
      end
    elseif now - age < st.ss then
      -- Sent before the current step began: the same episode, not a new signal.
      outcome = 'dup'
    elseif a.ron > 0 and st.rt + 1 <= a.rhigh and max(base, st.bo) * (a.rhigh + 1) < a.rwin then
      -- Rampup pays up to its target of triggers per window for probing: the
      -- rate holds, as in one process. Only triggers beyond it take a step,
      -- and every trigger once the gap is too long for a window to hold more.
      outcome = 'ramp'
    else
      step(st, a, base, factor, bmin, bmax, skey)
      st.ss = now
      outcome = 'step'
    end
    if outcome ~= 'dup' then
      st.rt = st.rt + 1
      if st.bo > 0 then
        if bwin > 0 then
          -- A window the scope may not send in (its new gap or a hold runs
          -- past it) is not quiet: the countdown starts when it may send
          -- again, or a gap longer than the window would never be reached.
          local ready = max(st.hold, gap_end(st, base))
          if outcome == 'step' and now + max(base, st.bo) > ready then
            ready = now + max(base, st.bo)
          end
          if ready > now + bwin then st.rec = ready + bwin else st.rec = now + bwin end
        else
          st.rec = 0
        end
      end
    end
    save(skey, st, key_ttl)
    reply[#reply + 1] = outcome
    reply[#reply + 1] = fmt(st.bo)
  end
  return reply
end

if op == 'quota' then
  local key_ttl = tonumber(ARGV[o + 1])
  local scopes = tonumber(ARGV[o + 2])
  for i = 1, scopes do
    local b = o + 2 + (i - 1) * 4
    local consumed, remaining = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local quota, window = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    local skey = KEYS[2 * i]
    local st = load(skey)
    local widx = floor(now / window)
    if widx > st.qw then
      st.qw = widx
      st.qu = 0
    end
    -- The server's figures are for the current window: reservations may
    -- already count a later one, which they say nothing about.
    if widx == st.qw then
      if remaining >= 0 then
        st.qu = max(0, quota - remaining)
      else
        -- A refund gives back at most what is counted: below zero, the
        -- window would admit any amount.
        st.qu = max(0, st.qu + consumed)
      end
    end
    save(skey, st, max(key_ttl, window))
  end
  return {'ok', N}
end

return redis.error_reply('slotkit: unknown operation ' .. tostring(op))
