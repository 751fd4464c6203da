"""The base floor: keys, codecs, models, replies, settings and counters. No Redis."""
