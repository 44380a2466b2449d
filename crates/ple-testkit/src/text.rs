//! Token streams from real English text, for the benchmark and the demo.
//!
//! The demo must build and run in under two minutes on two cores; a real BPE tokenizer crate
//! (with its vocabulary files) adds over a minute of compile time, so words are tokenised
//! word-level instead: each distinct word or punctuation mark (with its leading space, as BPE
//! tokenisers do) maps to a stable id in the vocabulary by a hash. The streams keep the text's
//! real repetition structure (Zipf-like word frequencies, repeated bigrams and trigrams), which is
//! what decides how many distinct rows and pages a batch touches.

use ple_core::model::{EOS_TOKEN_ID, VOCAB_SIZE, splitmix64};

/// Public-domain English prose (Dickens 1859, Austen 1813, Melville 1851, the US Declaration of
/// Independence 1776), one document per entry.
pub const DOCUMENTS: [&str; 4] = [
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of \
     foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, \
     it was the season of Darkness, it was the spring of hope, it was the winter of despair, we had \
     everything before us, we had nothing before us, we were all going direct to Heaven, we were all going \
     direct the other way - in short, the period was so far like the present period, that some of its \
     noisiest authorities insisted on its being received, for good or for evil, in the superlative degree \
     of comparison only. There were a king with a large jaw and a queen with a plain face, on the throne of \
     England; there were a king with a large jaw and a queen with a fair face, on the throne of France. In \
     both countries it was clearer than crystal to the lords of the State preserves of loaves and fishes, \
     that things in general were settled for ever. It was the year of Our Lord one thousand seven hundred \
     and seventy-five. Spiritual revelations were conceded to England at that favoured period, as at this.",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in \
     want of a wife. However little known the feelings or views of such a man may be on his first entering \
     a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is \
     considered the rightful property of some one or other of their daughters. My dear Mr. Bennet, said his \
     lady to him one day, have you heard that Netherfield Park is let at last? Mr. Bennet replied that he \
     had not. But it is, returned she; for Mrs. Long has just been here, and she told me all about it. \
     Mr. Bennet made no answer. Do you not want to know who has taken it? cried his wife impatiently. You \
     want to tell me, and I have no objection to hearing it. This was invitation enough. Why, my dear, you \
     must know, Mrs. Long says that Netherfield is taken by a young man of large fortune from the north of \
     England; that he came down on Monday in a chaise and four to see the place, and was so much delighted \
     with it, that he agreed with Mr. Morris immediately; that he is to take possession before Michaelmas, \
     and some of his servants are to be in the house by the end of next week.",
    "Call me Ishmael. Some years ago - never mind how long precisely - having little or no money in my \
     purse, and nothing particular to interest me on shore, I thought I would sail about a little and see \
     the watery part of the world. It is a way I have of driving off the spleen and regulating the \
     circulation. Whenever I find myself growing grim about the mouth; whenever it is a damp, drizzly \
     November in my soul; whenever I find myself involuntarily pausing before coffin warehouses, and \
     bringing up the rear of every funeral I meet; and especially whenever my hypos get such an upper hand \
     of me, that it requires a strong moral principle to prevent me from deliberately stepping into the \
     street, and methodically knocking people's hats off - then, I account it high time to get to sea as \
     soon as I can. This is my substitute for pistol and ball. With a philosophical flourish Cato throws \
     himself upon his sword; I quietly take to the ship. There is nothing surprising in this. If they but \
     knew it, almost all men in their degree, some time or other, cherish very nearly the same feelings \
     towards the ocean with me.",
    "When in the Course of human events, it becomes necessary for one people to dissolve the political \
     bands which have connected them with another, and to assume among the powers of the earth, the \
     separate and equal station to which the Laws of Nature and of Nature's God entitle them, a decent \
     respect to the opinions of mankind requires that they should declare the causes which impel them to \
     the separation. We hold these truths to be self-evident, that all men are created equal, that they \
     are endowed by their Creator with certain unalienable Rights, that among these are Life, Liberty and \
     the pursuit of Happiness. That to secure these rights, Governments are instituted among Men, deriving \
     their just powers from the consent of the governed, That whenever any Form of Government becomes \
     destructive of these ends, it is the Right of the People to alter or to abolish it, and to institute \
     new Government, laying its foundation on such principles and organizing its powers in such form, as \
     to them shall seem most likely to effect their Safety and Happiness. Prudence, indeed, will dictate \
     that Governments long established should not be changed for light and transient causes.",
];

/// Splits text the way a BPE pre-tokeniser does at word level: runs of letters/digits/apostrophes
/// with their leading space, and each other non-space character on its own.
pub fn pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut pending_space = false;
    for ch in text.chars() {
        if ch.is_alphanumeric() || ch == '\'' {
            if cur.is_empty() && pending_space {
                cur.push(' ');
            }
            pending_space = false;
            cur.push(ch);
        } else {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            if ch.is_whitespace() {
                pending_space = true;
            } else {
                let mut p = String::new();
                if pending_space {
                    p.push(' ');
                }
                p.push(ch);
                out.push(p);
                pending_space = false;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The token id of one piece: a stable hash into `[0, VOCAB_SIZE)`, never EOS.
pub fn piece_id(piece: &str) -> i32 {
    let mut h = 0x243F_6A88_85A3_08D3u64;
    for b in piece.bytes() {
        h = splitmix64(h ^ b as u64);
    }
    let mut id = (h % VOCAB_SIZE as u64) as i32;
    if id == EOS_TOKEN_ID {
        id += 1;
    }
    id
}

/// Tokens of document `doc` (mod the number of documents).
pub fn document_tokens(doc: usize) -> Vec<i32> {
    pieces(DOCUMENTS[doc % DOCUMENTS.len()])
        .iter()
        .map(|p| piece_id(p))
        .collect()
}

/// A stream of `n` tokens as an engine sees it: documents one after another, each starting with
/// EOS (the model's BOS), beginning with document `first_doc`.
pub fn stream(n: usize, first_doc: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(n);
    let mut d = first_doc;
    while out.len() < n {
        out.push(EOS_TOKEN_ID);
        out.extend(document_tokens(d));
        d += 1;
    }
    out.truncate(n);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn pieces_split_like_a_pretokeniser() {
        assert_eq!(
            pieces("It was, it's  done."),
            vec!["It", " was", ",", " it's", " done", "."]
        );
    }

    #[test]
    fn streams_are_real_text_with_repetition() {
        let s = stream(2048, 0);
        assert_eq!(s.len(), 2048);
        assert_eq!(s[0], EOS_TOKEN_ID);
        assert!(s.iter().all(|&t| (0..VOCAB_SIZE as i32).contains(&t)));
        let distinct: HashSet<_> = s.iter().collect();
        // real prose repeats words: far fewer distinct ids than tokens, far more than a handful
        assert!(
            distinct.len() > 300 && distinct.len() < 1200,
            "{} distinct",
            distinct.len()
        );
        let the = piece_id(" the");
        assert!(s.iter().filter(|&&t| t == the).count() > 40);
    }
}
