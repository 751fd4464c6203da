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
 * flags. It runs only functions whose names start with "sq_".
 *
 * Built by `make module` (no dependency but a C compiler): the few module API
 * entries used are declared below, looked up by name at load time as Redis's
 * own header does.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct RedisModuleCtx RedisModuleCtx;
typedef struct RedisModuleString RedisModuleString;
typedef struct RedisModuleCallReply RedisModuleCallReply;
typedef int (*RedisModuleCmdFunc)(RedisModuleCtx *ctx, RedisModuleString **argv, int argc);

#define REDISMODULE_OK 0
#define REDISMODULE_ERR 1
#define REDISMODULE_APIVER_1 1
#define STREAMQ_MODULE_VERSION 1

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

#define GET_API(name) \
    if (RedisModule_GetApi("RedisModule_" #name, (void *)&RedisModule_##name) != REDISMODULE_OK) \
        return REDISMODULE_ERR

/* The function name's prefix: SQ.FCALL runs streamq's functions and nothing else. */
static const char PREFIX[] = "sq_";

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
    if (argc < 3) return RedisModule_WrongArity(ctx);
    numkeys = numkeys_of(argv, argc);
    if (numkeys < 0)
        return RedisModule_ReplyWithError(ctx, "ERR sq.fcall: numkeys is not a key count of this call");
    fn = RedisModule_StringPtrLen(argv[1], &len);
    if (len <= sizeof(PREFIX) - 1 || strncmp(fn, PREFIX, sizeof(PREFIX) - 1) != 0)
        return RedisModule_ReplyWithError(ctx, "ERR sq.fcall runs streamq's functions (sq_*) only");
    /* !: the function's writes go to the replicas and the AOF, as FCALL's do (without
     * it Redis propagates nothing of a module's nested call); E: errors (an unknown
     * function, OOM) come back as replies; 0: in the caller's protocol */
    reply = RedisModule_Call(ctx, "FCALL", "!0Ev", argv + 1, (size_t)(argc - 1));
    if (reply == NULL)
        return RedisModule_ReplyWithError(ctx, "ERR sq.fcall: the function could not be called");
    RedisModule_ReplyWithCallReply(ctx, reply);
    RedisModule_FreeCallReply(reply);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    RedisModule_GetApi = (int (*)(const char *, void *))(unsigned long)((void **)ctx)[0];
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
    if (RedisModule_IsModuleNameBusy("streamq")) return REDISMODULE_ERR;
    RedisModule_SetModuleAttribs(ctx, "streamq", STREAMQ_MODULE_VERSION, REDISMODULE_APIVER_1);
    if (RedisModule_CreateCommand(ctx, "sq.fcall", sq_fcall, "write getkeys-api", 0, 0, 0) ==
        REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
