//! Token streams for `ple bench`: real English text, word-level, mapped into the vocabulary.
//!
//! The text is [`crate::text::DOCUMENTS`] (public-domain English prose), split into word and
//! punctuation tokens and mapped into the vocabulary exactly as the demo's streams are
//! ([`crate::text::pieces`], [`crate::text::piece_id`]).
//!
//! A few paragraphs hold only ~360 distinct words and ~700 distinct bigrams, far fewer than a
//! 2,048-token chunk of real text touches, so streams are generated: each next token follows the
//! text's order-1 word Markov chain, except with probability [`NOVELTY`] it is drawn from a Zipf
//! law (exponent 1) over a 40,000-word vocabulary whose most frequent ranks are the text's own
//! words by frequency (the long tail stands in for words this text lacks). That keeps English's
//! Zipf-shaped word frequencies and gives about 30% distinct tokens, 65% distinct bigrams and 89%
//! distinct trigrams per 2,048 tokens, close to running English prose. Every ~30 sentences a document ends with EOS.

/// Probability that the next token is drawn from the Zipf law instead of the Markov chain.
pub const NOVELTY: f64 = 0.3;
/// Words of the Zipf law.
const ZIPF_WORDS: usize = 40_000;

/// The word-level corpus and its Markov chain.
pub struct Corpus {
    /// Zipf law: cumulative weights by rank, and the token id of each rank.
    zipf_cdf: Vec<f64>,
    zipf_ids: Vec<i32>,
    /// Position in `tokens` of each corpus token id (to continue the chain after a Zipf draw).
    pos_of: std::collections::HashMap<i32, u32>,
    /// Token ids of the text, in order.
    pub tokens: Vec<i32>,
    /// For each position, whether the token ends a sentence.
    ends: Vec<bool>,
    /// Successor positions of each distinct token id (positions in `tokens`).
    next: std::collections::HashMap<i32, Vec<u32>>,
    /// Positions that start a sentence.
    starts: Vec<u32>,
    pub eos: i32,
    /// Distinct token strings.
    pub vocab_used: usize,
}

impl Corpus {
    pub fn new(vocab_size: u32, eos: i32) -> Corpus {
        // the shared public-domain documents, split and mapped like the demo's streams
        let words: Vec<String> = crate::text::DOCUMENTS
            .iter()
            .flat_map(|d| crate::text::pieces(d))
            .collect();
        let id = |w: &str| {
            let v = crate::text::piece_id(w);
            debug_assert!((v as u32) < vocab_size && v != eos);
            v
        };
        let tokens: Vec<i32> = words.iter().map(|w| id(w)).collect();
        let ends: Vec<bool> = words
            .iter()
            .map(|w| matches!(w.trim(), "." | "?" | "!"))
            .collect();
        let mut next: std::collections::HashMap<i32, Vec<u32>> = Default::default();
        for (i, w) in tokens.windows(2).enumerate() {
            next.entry(w[0]).or_default().push(i as u32 + 1);
        }
        let mut starts = vec![0u32];
        for (i, &e) in ends.iter().enumerate() {
            if e && i + 1 < tokens.len() {
                starts.push(i as u32 + 1);
            }
        }
        let mut distinct = words.clone();
        distinct.sort();
        distinct.dedup();
        // Zipf ranks: the text's words by frequency, then a synthetic tail
        let mut freq: std::collections::HashMap<i32, usize> = Default::default();
        for &t in &tokens {
            *freq.entry(t).or_default() += 1;
        }
        let mut by_freq: Vec<(i32, usize)> = freq.into_iter().collect();
        by_freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut zipf_ids: Vec<i32> = by_freq.iter().map(|x| x.0).collect();
        let mut r = 0u64;
        while zipf_ids.len() < ZIPF_WORDS {
            r += 1;
            zipf_ids.push(id(&format!("\u{1}tail{r}")));
        }
        let mut acc = 0.0;
        let zipf_cdf = (1..=ZIPF_WORDS)
            .map(|k| {
                acc += 1.0 / k as f64;
                acc
            })
            .collect();
        let mut pos_of = std::collections::HashMap::new();
        for (i, &t) in tokens.iter().enumerate() {
            pos_of.entry(t).or_insert(i as u32);
        }
        Corpus {
            zipf_cdf,
            zipf_ids,
            pos_of,
            tokens,
            ends,
            next,
            starts,
            eos,
            vocab_used: distinct.len(),
        }
    }

    /// A stream of `len` tokens, seeded by `seed` (see the module doc).
    pub fn stream(&self, seed: u64, len: usize) -> Vec<i32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rnd = move || {
            s = ple_core::model::splitmix64(s);
            s
        };
        let unit = |x: u64| (x >> 11) as f64 / (1u64 << 53) as f64;
        let mut out = Vec::with_capacity(len);
        let mut pos = self.starts[(rnd() % self.starts.len() as u64) as usize] as usize;
        // the token emitted last (a Zipf draw, or tokens[pos])
        let mut tok = self.tokens[pos];
        while out.len() < len {
            out.push(tok);
            if self.ends.get(pos).copied().unwrap_or(false)
                && tok == self.tokens[pos]
                && rnd() % 30 == 0
                && out.len() < len
            {
                out.push(self.eos);
                pos = self.starts[(rnd() % self.starts.len() as u64) as usize] as usize;
                tok = self.tokens[pos];
                continue;
            }
            if unit(rnd()) < NOVELTY {
                let total = *self.zipf_cdf.last().expect("non-empty");
                let x = unit(rnd()) * total;
                let k = self
                    .zipf_cdf
                    .partition_point(|&c| c < x)
                    .min(ZIPF_WORDS - 1);
                tok = self.zipf_ids[k];
                // continue the chain from this word if the text has it
                if let Some(&p) = self.pos_of.get(&tok) {
                    pos = p as usize;
                }
                continue;
            }
            pos = match self.next.get(&self.tokens[pos]) {
                Some(v) => v[(rnd() % v.len() as u64) as usize] as usize,
                None => self.starts[(rnd() % self.starts.len() as u64) as usize] as usize,
            };
            tok = self.tokens[pos];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_english_shaped_and_in_range() {
        let c = Corpus::new(248_320, 248_044);
        assert!(
            c.tokens.len() > 700 && c.vocab_used > 300,
            "{} {}",
            c.tokens.len(),
            c.vocab_used
        );
        let s = c.stream(1, 20_000);
        assert_eq!(s.len(), 20_000);
        assert!(s.iter().all(|&t| (0..248_320).contains(&t)));
        assert!(s.contains(&248_044));
        // Zipf-like: the most frequent token is far more common than the median one
        let mut counts = std::collections::HashMap::new();
        for &t in &s {
            *counts.entry(t).or_insert(0usize) += 1;
        }
        let mut f: Vec<usize> = counts.values().copied().collect();
        f.sort_unstable_by(|a, b| b.cmp(a));
        assert!(f[0] > 20 * f[f.len() / 2], "{:?}", &f[..5]);
        assert_ne!(c.stream(1, 100), c.stream(2, 100));
        // running-text-like n-gram novelty in a 2,048-token chunk
        let s = c.stream(3, 2048);
        let distinct = |n: usize| {
            let mut v: Vec<&[i32]> = s.windows(n).collect();
            v.sort();
            v.dedup();
            v.len() as f64 / (2049 - n) as f64
        };
        let (b, t) = (distinct(2), distinct(3));
        eprintln!(
            "distinct bigrams {b:.2}, trigrams {t:.2}, unigrams {:.2}",
            distinct(1)
        );
        assert!(
            (0.5..0.9).contains(&b) && (0.7..0.97).contains(&t),
            "{b} {t}"
        );
    }
}
