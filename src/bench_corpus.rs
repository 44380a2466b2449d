//! Token streams for `ple bench`: real English text, word-level, mapped into the vocabulary.
//!
//! The text is a few paragraphs of public-domain 19th-century English (openings of Dickens' *A
//! Tale of Two Cities* (1859), Austen's *Pride and Prejudice* (1813), Melville's *Moby-Dick*
//! (1851), and Lincoln's Gettysburg Address (1863)), quoted from memory for benchmark input only.
//! Words and punctuation marks are tokens (case kept, as tokenizers do); each distinct token
//! string maps to a fixed id in `[0, vocab_size)` other than EOS.
//!
//! A few paragraphs hold only ~360 distinct words and ~700 distinct bigrams, far fewer than a
//! 2,048-token chunk of real text touches, so streams are generated: each next token follows the
//! text's order-1 word Markov chain, except with probability [`NOVELTY`] it is drawn from a Zipf
//! law (exponent 1) over a 40,000-word vocabulary whose most frequent ranks are the text's own
//! words by frequency (the long tail stands in for words this text lacks). That keeps English's
//! Zipf-shaped word frequencies and gives about 30% distinct tokens, 65% distinct bigrams and 89%
//! distinct trigrams per 2,048 tokens, close to running English prose. Every ~30 sentences a document ends with EOS.

const TEXT: &str = "It was the best of times, it was the worst of times, it was the age of wisdom, \
it was the age of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was \
the season of Light, it was the season of Darkness, it was the spring of hope, it was the winter of \
despair, we had everything before us, we had nothing before us, we were all going direct to Heaven, \
we were all going direct the other way; in short, the period was so far like the present period, \
that some of its noisiest authorities insisted on its being received, for good or for evil, in the \
superlative degree of comparison only. There were a king with a large jaw and a queen with a plain \
face, on the throne of England; there were a king with a large jaw and a queen with a fair face, on \
the throne of France. In both countries it was clearer than crystal to the lords of the State \
preserves of loaves and fishes, that things in general were settled for ever. \
It is a truth universally acknowledged, that a single man in possession of a good fortune, must be \
in want of a wife. However little known the feelings or views of such a man may be on his first \
entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, \
that he is considered the rightful property of some one or other of their daughters. My dear Mr. \
Bennet, said his lady to him one day, have you heard that Netherfield Park is let at last? Mr. \
Bennet replied that he had not. But it is, returned she; for Mrs. Long has just been here, and she \
told me all about it. Mr. Bennet made no answer. Do you not want to know who has taken it? cried \
his wife impatiently. You want to tell me, and I have no objection to hearing it. This was \
invitation enough. \
Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my \
purse, and nothing particular to interest me on shore, I thought I would sail about a little and \
see the watery part of the world. It is a way I have of driving off the spleen and regulating the \
circulation. Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly \
November in my soul; whenever I find myself involuntarily pausing before coffin warehouses, and \
bringing up the rear of every funeral I meet; and especially whenever my hypos get such an upper \
hand of me, that it requires a strong moral principle to prevent me from deliberately stepping \
into the street, and methodically knocking people's hats off, then, I account it high time to get \
to sea as soon as I can. This is my substitute for pistol and ball. \
Four score and seven years ago our fathers brought forth on this continent, a new nation, \
conceived in Liberty, and dedicated to the proposition that all men are created equal. Now we are \
engaged in a great civil war, testing whether that nation, or any nation so conceived and so \
dedicated, can long endure. We are met on a great battle-field of that war. We have come to \
dedicate a portion of that field, as a final resting place for those who here gave their lives \
that that nation might live. It is altogether fitting and proper that we should do this. But, in a \
larger sense, we can not dedicate, we can not consecrate, we can not hallow, this ground. The brave \
men, living and dead, who struggled here, have consecrated it, far above our poor power to add or \
detract. The world will little note, nor long remember what we say here, but it can never forget \
what they did here. It is for us the living, rather, to be dedicated here to the unfinished work \
which they who fought here have thus far so nobly advanced. It is rather for us to be here \
dedicated to the great task remaining before us, that from these honored dead we take increased \
devotion to that cause for which they gave the last full measure of devotion, that we here highly \
resolve that these dead shall not have died in vain, that this nation, under God, shall have a new \
birth of freedom, and that government of the people, by the people, for the people, shall not \
perish from the earth.";

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

fn fnv1a(s: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Corpus {
    pub fn new(vocab_size: u32, eos: i32) -> Corpus {
        let mut words: Vec<String> = Vec::new();
        let mut cur = String::new();
        for c in TEXT.chars() {
            if c.is_alphanumeric() || c == '\'' || c == '-' {
                cur.push(c);
            } else {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                if !c.is_whitespace() {
                    words.push(c.to_string());
                }
            }
        }
        if !cur.is_empty() {
            words.push(cur);
        }
        let id = |w: &str| {
            let v = (fnv1a(w) % (vocab_size as u64 - 1)) as i32;
            if v >= eos { v + 1 } else { v }
        };
        let tokens: Vec<i32> = words.iter().map(|w| id(w)).collect();
        let ends: Vec<bool> = words.iter().map(|w| w == "." || w == "?").collect();
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
            s = crate::model::splitmix64(s);
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
