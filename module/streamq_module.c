/*
 * streamq's Redis module: one command, SQ.FCALL, that runs a function of
 * streamq's library on the caller's behalf.
 *
 *   SQ.FCALL <function> <numkeys> key [key ...] arg [arg ...]
 *
 * Redis runs a function's commands with the caller's ACL permissions, so a
 * user that may FCALL streamq's functions must also hold every command they
 * run, and could send those writes directly. SQ.FCALL runs FCALL from the
 * module's own context, whose commands are not checked against the caller's
 * ACL: a role is given `+sq.fcall|sq_<name>` for each of its functions, and no
 * write command at all. What SQ.FCALL itself is checked for by Redis, as any
 * command: the first-argument ACL rules (which functions), the key patterns
 * (its KEYS are declared with the getkeys API, so Redis Cluster routes and
 * refuses cross-slot calls as it does FCALL's), and OOM by the function's own
 * flags. It runs only functions whose names are "sq_" and then [a-z0-9_].
 *
 * It runs only for a client's own call (or one queued in MULTI and run by EXEC): it
 * is refused from a script or a function, and from another module's call. A
 * function that runs a command which runs a function again is nested scripting,
 * which Redis 7.0 does not support (the server dies on an assertion, script.c
 * '!curr_run_ctx'). Redis itself refuses it from EVAL and functions by the
 * command's deny-script flag (COMMAND INFO: noscript); the command checks again
 * itself, as that flag can be switched off (DEBUG set-disable-deny-scripts) and
 * does not cover another module's RedisModule_Call.
 *
 * Built by `make module` (no dependency but a C compiler): the few module API
 * entries used are declared below, with the values of Redis 7.0's redismodule.h,
 * and looked up by name at load time as Redis's own header does; the module does
 * not load on a server that lacks any of them, or the context flags it checks.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1
/* RedisModule_GetContextFlags(): the command runs in a script or a function (Redis
 * 7.0's "Lua" flag covers both), in EXEC */
#define REDISMODULE_CTX_FLAGS_LUA (1 << 0)
#define REDISMODULE_CTX_FLAGS_MULTI (1 << 1)
#define STREAMQ_MODULE_VERSION 2
/* Redis Functions (FCALL) came with 7.0.0; RedisModule_GetServerVersion's 0x00MMmmpp */
#define STREAMQ_MIN_SERVER_VERSION 0x00070000

static int (*RedisModule_GetApi)(const char *, void *);
static void (*RedisModule_SetModuleAttribs)(RedisModuleCtx *, const char *, int, int);
static int (*RedisModule_IsModuleNameBusy)(const char *);
static int (*RedisModule_CreateCommand)(RedisModuleCtx *, const char *, RedisModuleCmdFunc,
                                        const char *, int, int, int);
static RedisModuleCallReply *(*RedisModule_Call)(RedisModuleCtx *, const char *, const char *,
                                                 ...);
static int (*RedisModule_ReplyWithCallReply)(RedisModuleCtx *, RedisModuleCallReply *);
static void (*RedisModule_FreeCallReply)(RedisModuleCallReply *);
static int (*RedisModule_WrongArity)(RedisModuleCtx *);
static int (*RedisModule_ReplyWithError)(RedisModuleCtx *, const char *);
static const char *(*RedisModule_StringPtrLen)(const RedisModuleString *, size_t *);
static int (*RedisModule_IsKeysPositionRequest)(RedisModuleCtx *);
static void (*RedisModule_KeyAtPos)(RedisModuleCtx *, int);
static int (*RedisModule_GetContextFlags)(RedisModuleCtx *);
static int (*RedisModule_GetContextFlagsAll)(void);
static int (*RedisModule_GetServerVersion)(void);
static unsigned long long (*RedisModule_GetClientId)(RedisModuleCtx *);
static int (*RedisModule_GetClientInfoById)(void *, uint64_t);
static void (*RedisModule_Log)(RedisModuleCtx *, const char *, const char *, ...);

/* Looks an API entry up, or refuses to load (with a log line once Log is known) */
#define GET_API(name)                                                                        \
    do {                                                                                     \
        if (RedisModule_GetApi("RedisModule_" #name, (void *)&RedisModule_##name) !=        \
                REDISMODULE_OK ||                                                            \
            RedisModule_##name == NULL) {                                                    \
            if (RedisModule_Log != NULL)                                                     \
                RedisModule_Log(ctx, "warning",                                              \
                                "streamq: not loaded: this server's module API lacks "      \
                                "RedisModule_" #name);                                       \
            return REDISMODULE_ERR;                                                          \
        }                                                                                    \
    } while (0)

/* The function name's prefix: SQ.FCALL runs streamq's functions and nothing else. */
static const char PREFIX[] = "sq_";

/* Set while SQ.FCALL's own FCALL runs: whatever that function leads to, SQ.FCALL is
 * not entered again (a nested function call) */
static int in_fcall;

/* A streamq function's name: "sq_" then one or more of [a-z0-9_] */
static int is_streamq_function(const char *fn, size_t len) {
    if (len <= sizeof(PREFIX) - 1 || strncmp(fn, PREFIX, sizeof(PREFIX) - 1) != 0) return 0;
    for (size_t i = sizeof(PREFIX) - 1; i < len; i++)
        if (!((fn[i] >= 'a' && fn[i] <= 'z') || (fn[i] >= '0' && fn[i] <= '9') || fn[i] == '_'))
            return 0;
    return 1;
}

/* Whether the command runs for a client's own call: not inside SQ.FCALL's FCALL, not
 * in a script or a function, and from a connected client (a script's client and
 * another module's RedisModule_Call client are not connections, which Redis finds by
 * id). A call queued in MULTI and run by EXEC is a client's own: FCALL runs there
 * as it runs outside one. */
static int called_by_a_client(RedisModuleCtx *ctx) {
    if (in_fcall) return 0;
    if (RedisModule_GetContextFlags(ctx) & REDISMODULE_CTX_FLAGS_LUA) return 0;
    return RedisModule_GetClientInfoById(NULL, (uint64_t)RedisModule_GetClientId(ctx)) ==
           REDISMODULE_OK;
}

/* The key count of a call, or -1 when it is not a number that fits argc. */
static long numkeys_of(RedisModuleString **argv, int argc) {
    size_t len;
    const char *s = RedisModule_StringPtrLen(argv[2], &len);
    char *end;
    long n;
    if (len == 0 || len > 9) return -1;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9') return -1;
    n = strtol(s, &end, 10);
    if (end != s + len || n < 0 || n > argc - 3) return -1;
    return n;
}

static int sq_fcall(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    size_t len;
    const char *fn;
    long numkeys;
    RedisModuleCallReply *reply;
    /* Redis asks for the keys (ACL, cluster slot) before it runs the command, with
     * whatever arguments it was given: no reply may be sent then */
    if (RedisModule_IsKeysPositionRequest(ctx)) {
        numkeys = argc < 3 ? 0 : numkeys_of(argv, argc);
        for (long i = 0; i < numkeys; i++) RedisModule_KeyAtPos(ctx, (int)(3 + i));
        return REDISMODULE_OK;
    }
    if (!called_by_a_client(ctx))
        return RedisModule_ReplyWithError(
            ctx, "ERR sq.fcall may not be called from a script, a function or a module call");
    if (argc < 3) return RedisModule_WrongArity(ctx);
    numkeys = numkeys_of(argv, argc);
    if (numkeys < 0)
        return RedisModule_ReplyWithError(ctx, "ERR sq.fcall: numkeys is not a key count of this call");
    fn = RedisModule_StringPtrLen(argv[1], &len);
    if (!is_streamq_function(fn, len))
        return RedisModule_ReplyWithError(
            ctx, "ERR sq.fcall runs streamq's functions (sq_ then [a-z0-9_]) only");
    /* !: the function's writes go to the replicas and the AOF, as FCALL's do (without
     * it Redis propagates nothing of a module's nested call); E: errors (an unknown
     * function, OOM) come back as replies; 0: in the caller's protocol */
    in_fcall = 1;
    reply = RedisModule_Call(ctx, "FCALL", "!0Ev", argv + 1, (size_t)(argc - 1));
    in_fcall = 0;
    if (reply == NULL)
        return RedisModule_ReplyWithError(ctx, "ERR sq.fcall: the function could not be called");
    RedisModule_ReplyWithCallReply(ctx, reply);
    RedisModule_FreeCallReply(reply);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    const int flags_needed = REDISMODULE_CTX_FLAGS_LUA | REDISMODULE_CTX_FLAGS_MULTI;
    int version;
    (void)argv;
    (void)argc;
    RedisModule_GetApi = (int (*)(const char *, void *))(unsigned long)((void **)ctx)[0];
    if (RedisModule_GetApi == NULL) return REDISMODULE_ERR;
    GET_API(Log);
    GET_API(SetModuleAttribs);
    GET_API(IsModuleNameBusy);
    GET_API(CreateCommand);
    GET_API(Call);
    GET_API(ReplyWithCallReply);
    GET_API(FreeCallReply);
    GET_API(WrongArity);
    GET_API(ReplyWithError);
    GET_API(StringPtrLen);
    GET_API(IsKeysPositionRequest);
    GET_API(KeyAtPos);
    GET_API(GetContextFlags);
    GET_API(GetContextFlagsAll);
    GET_API(GetServerVersion);
    GET_API(GetClientId);
    GET_API(GetClientInfoById);
    version = RedisModule_GetServerVersion();
    if (version < STREAMQ_MIN_SERVER_VERSION) {
        RedisModule_Log(ctx, "warning",
                        "streamq: not loaded: Redis %d.%d.%d has no Redis Functions (7.0 or "
                        "later needed)", (version >> 16) & 0xff, (version >> 8) & 0xff,
                        version & 0xff);
        return REDISMODULE_ERR;
    }
    if ((RedisModule_GetContextFlagsAll() & flags_needed) != flags_needed) {
        RedisModule_Log(ctx, "warning",
                        "streamq: not loaded: this server's context flags lack LUA or MULTI");
        return REDISMODULE_ERR;
    }
    if (RedisModule_IsModuleNameBusy("streamq")) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, "streamq", STREAMQ_MODULE_VERSION, REDISMODULE_APIVER_1);
    /* deny-script: Redis refuses it from EVAL and functions ("noscript" in COMMAND
     * INFO; a module spells it deny-script, and an unknown flag fails the load) */
    if (RedisModule_CreateCommand(ctx, "sq.fcall", sq_fcall, "write deny-script getkeys-api", 0,
                                  0, 0) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
