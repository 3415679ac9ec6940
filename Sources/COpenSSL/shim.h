#ifndef SIWA_COPENSSL_SHIM_H
#define SIWA_COPENSSL_SHIM_H
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/bio.h>
#include <openssl/rsa.h>
#include <openssl/ec.h>

/* Macros and constants that do not import into Swift, as functions. */
static inline const char *siwa_ossl_pkey_param_rsa_n(void) { return OSSL_PKEY_PARAM_RSA_N; }
static inline const char *siwa_ossl_pkey_param_rsa_e(void) { return OSSL_PKEY_PARAM_RSA_E; }
static inline int siwa_evp_pkey_keypair(void) { return EVP_PKEY_KEYPAIR; }
static inline int siwa_evp_pkey_public_key(void) { return EVP_PKEY_PUBLIC_KEY; }
static inline long siwa_bio_get_mem_data(BIO *bio, char **out) { return BIO_get_mem_data(bio, out); }
static inline int siwa_rsa_pkcs1_padding(void) { return RSA_PKCS1_PADDING; }
static inline const char *siwa_ossl_pkey_param_bits(void) { return OSSL_PKEY_PARAM_BITS; }
#endif
